# One image for every role; the role is the command: `mgrpo serve controller|planner|subagent`.
#   docker build -t mgrpo .                              # CPU (default)
#   docker build -t mgrpo:cuda --build-arg TORCH_VARIANT=cu126 .   # CUDA torch for GPU trainers
# Without a registry or an index (an air-gapped build): a base image of your own with python3.11 and pip
#   --build-arg PYTHON_IMAGE=…, and a folder of wheels in the build context, --build-arg WHEELHOUSE=…
#   (default ./wheelhouse, used when present; tests/deploy/offline_images.sh makes both): pip then
#   installs from those wheels only.
# SGLang servers run from SGLang's own image (see docker-compose.yml, profile gpu): SGLang pins its
# own CUDA torch and is not installed beside ours.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_VARIANT=cpu
ARG WHEELHOUSE=wheelhouse
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MGRPO_CHECKPOINT_DIR=/data/checkpoints MGRPO_CACHE_DIR=/data/cache PORT=8000

RUN useradd --create-home --uid 10001 mgrpo && mkdir -p /data /app && chown mgrpo /data /app
WORKDIR /app

# Dependencies first (a layer that changes only with pyproject.toml), the source after.
COPY pyproject.toml ./
COPY pyproject.toml ${WHEELHOUSE}* /tmp/wheelhouse/
# pip reads its index settings from the environment: the wheelhouse when there is one, else the indexes
RUN echo 'if ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheelhouse; \
    else export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/'"${TORCH_VARIANT}"'; fi' > /tmp/pip-source.sh
RUN mkdir -p mgrpo shared_store planner_trainer subagent_trainer services \
 && for p in mgrpo shared_store planner_trainer subagent_trainer services; do touch $p/__init__.py; done \
 && touch README.md \
 && . /tmp/pip-source.sh && pip install '.[tracking]' && pip uninstall -y mgrpo && rm -rf build *.egg-info
COPY README.md ./
COPY mgrpo ./mgrpo
COPY shared_store ./shared_store
COPY planner_trainer ./planner_trainer
COPY subagent_trainer ./subagent_trainer
COPY services ./services
# Wheels are built from a clean tree: a stale build/ holding the placeholders (newer than the copied
# sources, so setuptools kept them) once gave an image whose `mgrpo` package was empty.
RUN rm -rf build *.egg-info && . /tmp/pip-source.sh && pip install --no-deps . \
 && rm -rf build *.egg-info /tmp/wheelhouse /tmp/pip-source.sh

USER mgrpo
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=4 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\", \"8000\")}/healthz', timeout=4)"
ENTRYPOINT ["mgrpo"]
CMD ["serve", "controller", "--port", "8000"]
