#!/usr/bin/env bash
# Ray for the GPU machine, which has no network and no ray, and takes at most 64 MiB of working tree and
# carried paths together (the ray 2.60 wheel alone is 79 MB). Run HERE, once, before scripts/ray_gpu.sh:
#   scripts/ray_pack.sh [DIR] [PYTHON_VERSION]        (default .rayship, 3.12: the GPU machine's python3)
# DIR then holds:
#   ray-2.60.0-cpXY.tar.xz: the wheel's files without what the trainer never loads (Java jars 34 MB, RLlib,
#     Tune, Train, Serve, Data, LLM, tests, the dashboard's JS source maps): 201 MB -> ~140 MB unpacked,
#     ~21 MB as xz -9e (3.5 min on 2 cores; XZ_LEVEL=-1 for a quick CPU check, ~30 MB);
#   the wheels of what ray needs that the GPU machine lacks (jsonschema and its three; /work/.library/device
#     KINDS.md lists the rest as installed: click, filelock, msgpack, packaging, protobuf, pyyaml, requests).
# Carry DIR: run(carry=[".rayship"]); scripts/ray_gpu.sh unpacks and installs it into a temporary dir there.
# DIR must be ignored by git (the carry rule): .gitignore has /.rayship/.
set -euo pipefail
dir=${1:-.rayship}
pyver=${2:-3.12}
tag=cp${pyver/./}
version=2.60.0
mkdir -p "$dir"
work=$(mktemp -d /tmp/raypack.XXXXXX)
trap 'rm -rf "$work"' EXIT
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pip_download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" -d "$1" "${@:2}"
}
pip_download "$work" "ray==$version"
rm -f "$dir"/*.whl "$dir"/ray-*.tar.xz
pip_download "$dir" jsonschema jsonschema-specifications referencing rpds-py
mkdir "$work/x"
(cd "$work/x" && python3 -m zipfile -e "$work"/ray-*.whl . )
# zipfile -e drops the execute bits: the daemons Ray starts need them back
chmod +x "$work/x/ray/core/src/ray/raylet/raylet" "$work/x/ray/core/src/ray/gcs/gcs_server"
find "$work/x" -name "*.so" -exec chmod +x {} +
(cd "$work/x/ray" && rm -rf jars rllib tune train serve data llm && find . -type d -name tests -prune -exec rm -rf {} + \
  && rm -f dashboard/client/build/static/js/*.map)
tar -C "$work/x" -cf - . | xz "${XZ_LEVEL:--9e}" -T2 > "$dir/ray-$version-$tag.tar.xz"
ls -la "$dir"
du -cb "$dir"/* | tail -1
