"""An offline twin of the apiserver's CRD validation and the operators' admission webhooks (test-only)."""
