#!/usr/bin/env bash
# Fetch, here, the wheels that benchmark/gpu_check.sh needs on a GPU machine that cannot download.
#
#   bash benchmark/gpu_wheels.sh            # into .whl/ (git-ignored), for CPython 3.12 on x86-64 Linux
#   bash benchmark/gpu_wheels.sh 3.11 DIR   # another Python version or folder
#
# The lent GPU machine's image (see the device tool's KINDS.md) has Python 3.12 with torch, numpy,
# tensorboard, opencv-python-headless, matplotlib, rich and absl-py, but not gymnasium, ale-py, tyro or
# mujoco. These are the project's pinned versions of those and of what they need that the image lacks,
# about 30 MB. On that machine, from the repository root:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash benchmark/gpu_check.sh
#
# (the device tool's run: name .whl in carry; throughput.md gives the whole call).
set -euo pipefail
pyver=${1:-3.12}
dest=${2:-.whl}
cd "$(dirname "$0")/.."
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" -d "$dest" \
    gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 \
    tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
    mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 websockets==17.4 glfw==2.11.0 pyopengl==3.1.10
ls "$dest"
du -sh "$dest"
