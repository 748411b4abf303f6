// cw-coscheduler-controller: scheduler-plugins' PodGroup controller (the status of PodGroups).
package main

import (
	"flag"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	schedulingv1a1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	"sigs.k8s.io/scheduler-plugins/pkg/controllers"
)

func main() {
	qps := flag.Float64("qps", 5, "client QPS")
	burst := flag.Int("burst", 10, "client burst")
	workers := flag.Int("workers", 1, "PodGroup reconcilers at once")
	probe := flag.String("health-probe-bind-address", "0", "where /healthz is served")
	klog.InitFlags(nil)
	flag.Parse()
	ctrl.SetLogger(klog.NewKlogr())

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(schedulingv1a1.AddToScheme(scheme))
	config := ctrl.GetConfigOrDie()
	config.QPS, config.Burst = float32(*qps), *burst
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: *probe,
	})
	if err != nil {
		klog.ErrorS(err, "unable to start manager")
		os.Exit(1)
	}
	reconciler := &controllers.PodGroupReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Workers: *workers}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		klog.ErrorS(err, "unable to create the PodGroup controller")
		os.Exit(1)
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		klog.ErrorS(err, "manager stopped")
		os.Exit(1)
	}
}
