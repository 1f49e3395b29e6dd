#!/usr/bin/env python3
"""Install (or update) CustomResourceDefinitions and wait until the apiserver serves them.

Used by up.sh; also handy on its own:

    python k8s/apiserver/install_crd.py --kubeconfig KUBECONFIG k8s/crds/kubeflow.org_pytorchjobs.yaml

A CRD is usable only once its `Established` condition is True (the apiserver has started
serving the new REST endpoints), which takes a few seconds after the create; creating custom
objects before that gives a plain-text 404.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

CRD_API = "apiextensions.k8s.io/v1"


def load_crds(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    bad = [d.get("kind") for d in docs if d.get("kind") != "CustomResourceDefinition"]
    if bad:
        raise SystemExit(f"{path}: expected only CustomResourceDefinition documents, found kind {bad}")
    return docs


def apply_crd(api: client.ApiextensionsV1Api, crd: dict[str, Any]) -> str:
    """Create the CRD, or replace it when one of that name exists (keeps up.sh idempotent)."""
    name = crd["metadata"]["name"]
    try:
        api.create_custom_resource_definition(body=crd)
        return "created"
    except ApiException as exc:
        if exc.status != 409:
            raise
    # Raw JSON reads keep this independent of the client's model classes, which changed
    # between client releases.
    current = json.loads(api.read_custom_resource_definition(name, _preload_content=False).data)
    body = dict(crd, metadata=dict(crd["metadata"], resourceVersion=current["metadata"]["resourceVersion"]))
    api.replace_custom_resource_definition(name, body=body)
    return "replaced"


def conditions(api: client.ApiextensionsV1Api, name: str) -> dict[str, dict[str, Any]]:
    raw = json.loads(api.read_custom_resource_definition(name, _preload_content=False).data)
    # Right after the create, status (or its conditions) is still null.
    return {c["type"]: c for c in (raw.get("status") or {}).get("conditions") or []}


def wait_established(api: client.ApiextensionsV1Api, name: str, timeout: float) -> float:
    """Poll until Established=True; NamesAccepted=False (a name clash) fails at once."""
    start = time.monotonic()
    while True:
        conds = conditions(api, name)
        if conds.get("Established", {}).get("status") == "True":
            return time.monotonic() - start
        names = conds.get("NamesAccepted", {})
        if names.get("status") == "False":
            raise SystemExit(f"CRD {name}: names not accepted: {names.get('message')}")
        if time.monotonic() - start > timeout:
            raise SystemExit(f"CRD {name}: not Established after {timeout:.0f}s; conditions: {conds}")
        time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd_files", nargs="+", type=Path)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait per CRD")
    args = parser.parse_args(argv)

    api = client.ApiextensionsV1Api(config.new_client_from_config(config_file=str(args.kubeconfig)))
    for path in args.crd_files:
        for crd in load_crds(path):
            name = crd["metadata"]["name"]
            try:
                verb = apply_crd(api, crd)
            except ApiException as exc:
                print(f"CRD {name} from {path}: HTTP {exc.status}: {exc.body}", file=sys.stderr)
                return 1
            took = wait_established(api, name, args.timeout)
            print(f"CRD {name} {verb}, Established after {took:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
