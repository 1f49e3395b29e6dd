"""Write a docker-archive (what `docker save` writes) of one rootfs layer, for `ctr images import`.

No registry and no image tool: manifest.json + the config JSON + layer.tar.
Usage: mkimage.py ROOTFS REF OUT.tar ENV_FILE CMD...   (ENV_FILE: KEY=VALUE lines, /dev/null for none)
"""

import hashlib
import io
import json
import os
import sys
import tarfile

MTIME = 0  # reproducible: the same rootfs gives the same image id


def layer_bytes(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(rootfs)):
            tar.add(os.path.join(rootfs, name), arcname=name, filter=_owned_by_root)
    return buf.getvalue()


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = MTIME
    return info


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), MTIME, 0o644
    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    rootfs, ref, out, env_file, *cmd = sys.argv[1:]
    with open(env_file) as f:
        env = [line.strip() for line in f if "=" in line]
    env = env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    layer = layer_bytes(rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": env, "Cmd": cmd or ["/bin/sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "k8s/kubelet/mkimage.py"}],
    }
    config_bytes = json.dumps(config).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id[7:] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    with tarfile.open(out, "w") as tar:
        add(tar, layer_name, layer)
        add(tar, config_name, config_bytes)
        add(tar, "manifest.json", json.dumps(manifest).encode())


if __name__ == "__main__":
    main()
