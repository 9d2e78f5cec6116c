# One image for every component of the Hops live system; compose.yaml picks
# each container's command (the same commands `hops up` runs, cli/up/stack.py).
#   docker build -t hops .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: a change of the code does not
# reinstall them.
# The exact versions of constraints.txt, as `make` installs them; only
# [project.dependencies]: torch (the `plugin` extra, for training scripts)
# and matplotlib (the `experiments` extra) stay out of the service image.
COPY pyproject.toml README.md constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY shared/ shared/
COPY scheduling/ scheduling/
COPY estimation/ estimation/
COPY services/ services/
COPY simulator/ simulator/
COPY world/ world/
COPY hops/ hops/
COPY cli/ cli/
COPY gateway/ gateway/
COPY executor/ executor/
COPY examples/ examples/
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 hops

# Commands run as `python -m <module>` from /app, so every package of the
# tree is importable as it is in the repository. experiments/ is left out:
# it needs matplotlib, and `hops experiment` says so here; every other
# command of `hops` imports without it (tests/test_extras.py).
USER hops
EXPOSE 8080 8081 9464
CMD ["hops", "--help"]
