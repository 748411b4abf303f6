"""Checks of a Grafana dashboard against the metrics quorum's processes export.

`expressions` lists every PromQL expression of a dashboard (panel targets, rows' nested panels,
query variables); `references` reads the metric names, function names and label names out of
one, by tokenizing it: label matchers, `by`/`without`/`on`/`ignoring`/`group_*` lists, range and
subquery brackets, string literals, numbers and durations, and Grafana's template variables
(`$namespace`, `${namespace:regex}`, `[[namespace]]`, `$__rate_interval`) are told apart from
the names. `Exported` reads what a `/metrics` text offers: a counter `x` is queried as
`x_total`, a histogram as `x_bucket`/`x_sum`/`x_count`, a gauge as `x`; a `_created` series
only if the text has it. A labelled metric whose children are made lazily (no sample yet) still
has its `# TYPE` line, so its names are known before its first sample.

`problems(expressions(dashboard), exported)` and `structure_problems(dashboard)` return what is
wrong, as messages (empty: nothing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

JSON = dict[str, Any]

AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
     "quantile", "limitk", "limit_ratio"}
)  # fmt: skip
FUNCTIONS = frozenset(
    {"abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
     "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
     "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta",
     "deriv", "double_exponential_smoothing", "end", "exp", "floor", "histogram_avg",
     "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
     "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "irate",
     "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "mad_over_time",
     "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear",
     "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn",
     "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt", "start",
     "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp",
     "vector", "year"}
)  # fmt: skip
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"})
MATCH_OPS = frozenset({"=", "!=", "=~", "!~"})
TARGET_LABELS = frozenset({"namespace", "job", "instance", "pod", "service", "endpoint", "container"})
"""Labels Prometheus (and the Prometheus Operator's ServiceMonitors) add to every scraped series."""
BUILTIN_VARIABLES = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "60000",
}
VARIABLE_MARK = "__grafana_variable__"

_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<number>0[xX][0-9a-fA-F]+
      | (?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}\[\]@:])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    pass


def variables(text: str) -> set[str]:
    """The template variables `text` uses."""
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(text)}


def substitute(text: str) -> str:
    """Grafana's interval variables by a duration, the others by a mark (harmless in a string
    literal, and reported as misplaced anywhere else)."""

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return BUILTIN_VARIABLES.get(name, VARIABLE_MARK)

    return _VARIABLE.sub(value, text)


def tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLError(f"cannot read {expr[pos : pos + 20]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind not in ("space", "comment"):
            out.append((kind, match.group()))
        pos = match.end()
    return out


@dataclass
class References:
    metrics: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def references(expr: str) -> References:
    """The metric names, functions and label names PromQL `expr` (with Grafana's variables) uses."""
    found = References()
    toks = tokens(substitute(expr))
    i = 0
    depth = 0  # parentheses, to match the brackets below
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if text == "[":  # a range or a subquery: durations and variables only
            end = _closing(toks, i, "[", "]")
            inside = toks[i + 1 : end]
            if any(k == "ident" for k, _ in inside):
                found.problems.append(f"not a duration in [...] of {expr!r}")
            i = end + 1
            continue
        if text == "{":  # label matchers
            end = _closing(toks, i, "{", "}")
            _matchers(toks[i + 1 : end], found, expr)
            i = end + 1
            continue
        if kind == "ident":
            lowered = text.lower()
            if text in GROUPING:
                if following == "(":
                    end = _closing(toks, i + 1, "(", ")")
                    labels = [t for k, t in toks[i + 2 : end] if k == "ident"]
                    found.labels.update(labels)
                    i = end + 1
                    continue
            elif text in AGGREGATIONS:
                found.functions.add(text)
            elif following == "(" and text not in KEYWORDS:
                found.functions.add(text)
                if text not in FUNCTIONS:
                    found.problems.append(f"unknown function {text!r} in {expr!r}")
            elif lowered in KEYWORDS:
                pass
            elif text == VARIABLE_MARK:
                found.problems.append(f"a template variable outside a string in {expr!r}")
            else:
                found.metrics.add(text)
        elif kind == "op" and text == "(":
            depth += 1
        elif kind == "op" and text == ")":
            depth -= 1
        i += 1
    if depth != 0:
        found.problems.append(f"unbalanced parentheses in {expr!r}")
    return found


def _closing(toks: list[tuple[str, str]], start: int, opening: str, closing: str) -> int:
    depth = 0
    for j in range(start, len(toks)):
        if toks[j][1] == opening:
            depth += 1
        elif toks[j][1] == closing:
            depth -= 1
            if depth == 0:
                return j
    raise PromQLError(f"no {closing!r} for the {opening!r} at token {start}")


def _matchers(toks: list[tuple[str, str]], found: References, expr: str) -> None:
    """`name op "value"` pairs separated by commas; `__name__="x"` names metric x."""
    for j in range(0, len(toks), 4):
        part = toks[j : j + 3]
        if len(part) != 3 or part[0][0] != "ident" or part[1][1] not in MATCH_OPS or part[2][0] != "string":
            found.problems.append(f"cannot read the matchers {' '.join(t for _, t in toks)!r} in {expr!r}")
            return
        if j + 3 < len(toks) and toks[j + 3][1] != ",":
            found.problems.append(f"no comma between matchers in {expr!r}")
            return
        label, op, value = part[0][1], part[1][1], part[2][1][1:-1]
        if label == "__name__":
            if op != "=":
                found.problems.append(f"__name__{op} cannot be checked in {expr!r}")
            else:
                found.metrics.add(value)
        else:
            found.labels.add(label)


# -- what the dashboard asks --------------------------------------------------------------------


def panels(dashboard: Mapping[str, Any]) -> Iterator[JSON]:
    """Every panel, those nested in (collapsed) rows too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<expr>.*),\s*)?(?P<label>\w+)\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.S)


def variable_query(variable: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the PromQL in a query variable, the label it reads), either possibly None."""
    query = variable.get("query")
    text = query.get("query", "") if isinstance(query, dict) else str(query or "")
    if (match := _LABEL_VALUES.match(text)) is not None:
        return match["expr"], match["label"]
    if (match := _QUERY_RESULT.match(text)) is not None:
        return match["expr"], None
    return (text or None), None


@dataclass(frozen=True)
class Query:
    row: str | None
    """The title of the row the panel is in (None: above every row, or a variable)."""
    where: str
    expr: str
    label: str | None = None
    """The label a query variable reads (`label_values(..., label)`)."""


def expressions(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every query of the dashboard: its panels' targets (in rows, collapsed or not) and its
    query variables."""
    out: list[Query] = []
    row: str | None = None
    for top in dashboard.get("panels", []):
        if top.get("type") == "row":
            row = top.get("title")
        for panel in [top, *top.get("panels", [])]:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    where = f"panel {panel.get('title')!r} {target.get('refId')}"
                    out.append(Query(row, where, target["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            expr, label = variable_query(variable)
            if expr or label:
                out.append(Query(None, f"variable {variable.get('name')!r}", expr or "", label))
    return out


# -- what the processes export ------------------------------------------------------------------

SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


@dataclass
class Exported:
    """Series names a process offers (name -> its labels), from its /metrics text."""

    labels: dict[str, set[str]] = field(default_factory=dict)
    families: dict[str, set[str]] = field(default_factory=dict)
    """Family name (a counter's without `_total`) -> its series names."""

    def add_text(self, text: str, labelnames: Mapping[str, Iterable[str]] | None = None) -> Exported:
        """Add a `/metrics` body; `labelnames` (family name -> label names) adds the labels of
        families whose children are made lazily (no sample shows them yet)."""
        known = labelnames or {}
        for family in text_string_to_metric_families(text):
            base = set(known.get(family.name, ()))
            names = {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
            for sample in family.samples:
                names.add(sample.name)
                base.update(sample.labels)
            self.families.setdefault(family.name, set()).update(names)
            for name in names:
                labels = self.labels.setdefault(name, set())
                labels.update(base - {"le", "quantile"})
                if name.endswith("_bucket"):
                    labels.add("le")
                if family.type == "summary" and name == family.name:
                    labels.add("quantile")
        return self

    def __contains__(self, name: object) -> bool:
        return name in self.labels


def problems(queries: Iterable[Query], exported: Exported, check_labels: bool = True) -> list[str]:
    """Every metric name `exported` lacks, unknown function, and (`check_labels`) label that no
    metric of its expression has, besides the labels the scrape adds. Labels of lazily made
    children are known only from the processes' collectors (`Exported.add_text(labelnames=)`),
    not from a scrape: check them in-process."""
    out: list[str] = []
    for query in queries:
        try:
            found = references(query.expr)
        except PromQLError as err:
            out.append(f"{query.where}: {err}")
            continue
        out.extend(f"{query.where}: {p}" for p in found.problems)
        for name in sorted(found.metrics - exported.labels.keys()):
            out.append(f"{query.where}: not exported: {name!r}")
        if query.label is not None:
            found.labels.add(query.label)
        offered = set(TARGET_LABELS).union(*(exported.labels.get(m, set()) for m in found.metrics))
        for label in sorted(found.labels - offered) if check_labels else []:
            out.append(f"{query.where}: no series of {sorted(found.metrics)} has the label {label!r}")
    return out


# -- what Grafana needs -------------------------------------------------------------------------


def _uses_variable(datasource: object, variable: str) -> bool:
    return isinstance(datasource, dict) and datasource.get("uid") in (f"${{{variable}}}", f"${variable}")


def structure_problems(dashboard: Mapping[str, Any]) -> list[str]:
    """What Grafana would refuse or show wrong: the schema version, the `datasource` variable,
    panel ids and grid positions, targets and their refIds, datasources by the variable, and
    variables used but not defined."""
    out: list[str] = []
    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 39:
        out.append(f"schemaVersion {dashboard.get('schemaVersion')!r} (39 or later)")
    for key in ("title", "uid"):
        if not dashboard.get(key):
            out.append(f"no {key}")
    templating = dashboard.get("templating", {}).get("list", [])
    defined = {v.get("name") for v in templating}
    datasource_vars = [
        v for v in templating if v.get("type") == "datasource" and v.get("query") == "prometheus"
    ]
    if not datasource_vars:
        out.append("no template variable of type datasource for prometheus")
    ds = datasource_vars[0]["name"] if datasource_vars else "datasource"
    for variable in templating:
        if variable.get("type") == "query" and not _uses_variable(variable.get("datasource"), ds):
            out.append(f"variable {variable.get('name')!r}: datasource is not ${ds}")
    ids: set[int] = set()
    boxes: list[tuple[str, int, int, int, int]] = []
    all_panels = list(panels(dashboard))
    if not all_panels:
        out.append("no panels")
    for panel in all_panels:
        name = f"panel {panel.get('title')!r}"
        pid = panel.get("id")
        if not isinstance(pid, int) or isinstance(pid, bool):
            out.append(f"{name}: id {pid!r} is not an integer")
        elif pid in ids:
            out.append(f"{name}: id {pid} is not unique")
        else:
            ids.add(pid)
        if not panel.get("type"):
            out.append(f"{name}: no type")
        grid = panel.get("gridPos")
        if not isinstance(grid, dict) or not all(
            isinstance(grid.get(k), int) and grid[k] >= 0 for k in ("h", "w", "x", "y")
        ):
            out.append(f"{name}: gridPos {grid!r} needs integer h, w, x, y")
        elif grid["w"] < 1 or grid["h"] < 1 or grid["x"] + grid["w"] > 24:
            out.append(f"{name}: gridPos {grid!r} outside the 24 columns")
        else:
            boxes.append((name, grid["x"], grid["y"], grid["w"], grid["h"]))
        if panel.get("type") == "row":
            continue
        if not _uses_variable(panel.get("datasource"), ds):
            out.append(f"{name}: datasource {panel.get('datasource')!r} is not ${ds}")
        targets = panel.get("targets")
        if not targets:
            out.append(f"{name}: no targets")
            continue
        refs = [t.get("refId") for t in targets]
        if not all(refs) or len(set(refs)) != len(refs):
            out.append(f"{name}: refIds {refs!r} must be present and unique")
        for target in targets:
            if not target.get("expr"):
                out.append(f"{name} {target.get('refId')}: no expr")
            if "datasource" in target and not _uses_variable(target["datasource"], ds):
                out.append(f"{name} {target.get('refId')}: datasource is not ${ds}")
    for a, (name, x, y, w, h) in enumerate(boxes):
        for other, x2, y2, w2, h2 in boxes[a + 1 :]:
            if x < x2 + w2 and x2 < x + w and y < y2 + h2 and y2 < y + h:
                out.append(f"{name} overlaps {other}")
    for query in expressions(dashboard):
        for variable in sorted(variables(query.expr) - defined - BUILTIN_VARIABLES.keys()):
            out.append(f"{query.where}: ${variable} is not a template variable")
    return out
