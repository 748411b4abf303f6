"""Admission policies: pure functions `(AdmissionRequest, WebhookSettings) -> Decision`.

Each lives in its own module; `quorum.webhooks.registry` lists which webhook runs which."""
