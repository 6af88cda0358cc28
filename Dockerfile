# The image AWS Batch (or any container scheduler) runs: the repository, its pinned requirements, and
# the launcher as entrypoint, so a job's command is `-- <script> <flags>`.
#
#   docker build -t cleanrl-torchrun:latest .                      # CUDA base (GPU instances)
#   docker build --build-arg BASE=cpu -t cleanrl-torchrun:cpu .     # CPU base, CPU-only torch wheel
#   docker run --rm cleanrl-torchrun:cpu -- cleanrl/ppo.py --env-id CartPole-v1 --total-timesteps 10000
#
# Both bases are Ubuntu 24.04 (Python 3.12) so the rest of the build is the same.
ARG BASE=cuda
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG CPU_IMAGE=ubuntu:24.04

FROM ${CUDA_IMAGE} AS base-cuda
# The default PyPI torch wheel is the CUDA build.
ENV TORCH_INDEX_URL=https://pypi.org/simple

FROM ${CPU_IMAGE} AS base-cpu
# Without this index pip pulls the multi-GB CUDA build of the same version.
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# A build stage, not an image to pin.
# hadolint ignore=DL3006
FROM base-${BASE}
ARG EXTRAS="atari mujoco"
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MUJOCO_GL=egl \
    SDL_VIDEODRIVER=dummy \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Ubuntu's archive drops old package versions, so apt pins would break the build; the base image tag is pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates libegl1 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /workspace

# Requirements before the code, so editing a script does not reinstall torch.
COPY requirements/ requirements/
RUN pip install --index-url "${TORCH_INDEX_URL}" "$(grep -E '^torch==' requirements/requirements.txt)" \
    && grep -v '^-e' requirements/requirements.txt > /tmp/core.txt \
    && pip install -r /tmp/core.txt \
    && for extra in ${EXTRAS}; do pip install -r "requirements/requirements-${extra}.txt"; done

COPY pyproject.toml README.md ./
COPY cleanrl_utils/ cleanrl_utils/
COPY cleanrl/ cleanrl/
RUN pip install --no-deps -e .

# runs/ is where checkpoints go: mount storage that outlives an attempt (EFS, a host path) here so a
# retried job resumes instead of starting over.
VOLUME ["/workspace/runs"]
ENTRYPOINT ["python", "-m", "cleanrl_utils.launch"]
CMD ["--", "cleanrl/ppo.py", "--help"]
