"""Kubernetes' name and value syntax, as its validation code states it, and the job's own name.

Each check returns an empty string when the text is valid, else what is wrong. The rules are
those of k8s.io/apimachinery/pkg/util/validation (IsDNS1123Label, IsDNS1123Subdomain,
IsQualifiedName, IsValidLabelValue), pkg/apis/core/helper (IsExtendedResourceName) and the image
reference grammar of github.com/distribution/reference, which the kubelet parses before a pull.
"""

from __future__ import annotations

import re

from dist_jobs.spec.model import JobSpec, hashed_name

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_NAME_PART_RULE = "alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"

# github.com/distribution/reference: [host[:port]/]path[:tag][@digest]
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def dns1123_label(text: str) -> str:
    if len(text) > 63:
        return f"is {len(text)} characters, at most 63 are allowed"
    if not _DNS1123_LABEL.fullmatch(text):
        return "must be lowercase letters, digits and '-', starting and ending with a letter or digit (RFC 1123)"
    return ""


def dns1123_subdomain(text: str) -> str:
    if len(text) > 253:
        return f"is {len(text)} characters, at most 253 are allowed"
    if not _DNS1123_SUBDOMAIN.fullmatch(text):
        return "must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (RFC 1123)"
    return ""


def qualified_name(text: str) -> str:
    """A label, annotation or node selector key: [prefix/]name, prefix a DNS subdomain."""
    prefix, slash, name = text.rpartition("/")
    if slash and not prefix:
        return "has an empty prefix before '/'"
    if slash and dns1123_subdomain(prefix):
        return f"has the prefix {prefix!r}, which {dns1123_subdomain(prefix)}"
    if not name:
        return "has no name" + (" after the prefix" if slash else "")
    if len(name) > 63:
        return f"has a name part of {len(name)} characters, at most 63 are allowed"
    if not _NAME_PART.fullmatch(name):
        return f"must be {_NAME_PART_RULE} (with an optional DNS prefix and '/')"
    return ""


def label_value(text: str) -> str:
    if len(text) > 63:
        return f"is {len(text)} characters, at most 63 are allowed"
    if text and not _NAME_PART.fullmatch(text):
        return f"must be empty or {_NAME_PART_RULE}"
    return ""


def extended_resource(text: str) -> str:
    """A device resource such as nvidia.com/gpu: a qualified name in a vendor's domain."""
    if "/" not in text:
        return "is not fully qualified: device resources are named DOMAIN/NAME, e.g. nvidia.com/gpu or amd.com/gpu"
    if "kubernetes.io/" in text or text.startswith("requests."):
        return "is in a namespace Kubernetes reserves (kubernetes.io/, requests.)"
    return qualified_name("requests." + text)


def image_reference(text: str) -> str:
    if not _IMAGE.fullmatch(text):
        return "is not an image reference [registry[:port]/]path[:tag][@digest] (path in lowercase)"
    return ""


_DNS_MAX = 63


def dns1035(name: str, max_len: int = _DNS_MAX) -> str:
    """Documented rule: a valid DNS-1035 label of at most `max_len` characters is used as it is.
    Any other name is lowercased, runs of characters outside [a-z0-9] become '-', a name that
    does not start with a letter gets the prefix 'j-', and it is cut and ends in '-' and a
    10-character hash of the whole name, so distinct names stay distinct (see spec.model.run_id)."""
    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if base and not base[0].isalpha():
        base = "j-" + base
    return hashed_name(name, base, max_len, "-")


def trainjob_name_limit(nodes: int) -> int:
    """JobSet names a TrainJob's pods <name>-node-0-<index>-<5 random> and its webhook refuses
    the job when the longest one is over 63 characters (jobset v0.12 pkg/webhooks/jobset_webhook.go)."""
    return 63 - len("-node-0-") - len(str(nodes - 1)) - len("-abcde")


def k8s_name(spec: JobSpec) -> str:
    """DNS-1035 job name. A PyTorchJob's is cut (with a hash) so `<name>-worker-<i>` Services stay
    valid labels; a TrainJob's is not cut: a name over its limit is a spec problem (k8s_rules)."""
    if spec.k8s.api == "trainjob":
        return dns1035(spec.name, 10**6)
    suffix = len(f"-worker-{max(spec.nodes, spec.k8s.max_nodes or 0)}")
    return dns1035(spec.name, 63 - suffix)
