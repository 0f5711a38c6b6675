# ckptlab where the CPU emulator cannot be built (macOS, native Windows): a Debian 12 image with
# Python 3.11 and g++ 12, that runs the README's two commands as they are written.
#
#   docker build -t ckptlab .           # installs, runs the tour, then the default tests
#   docker run --rm -v "$PWD/ckptlab-results:/ckptlab/ckptlab-results" ckptlab   # the tour again
#   docker run --rm -it -p 8888:8888 ckptlab .venv/bin/jupyter lab --ip=0.0.0.0 --allow-root labs/
#
# The emulator needs GCC >= 10 and GNU binutils (objcopy, addr2line) on Linux
# (ckptlab/emu/build.py); the image has no GPU, so the kernels run on the emulator.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ binutils git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /ckptlab
COPY . .

# the README's two commands, verbatim
RUN python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt -e . && .venv/bin/python -m ckptlab tour
RUN python3 -m venv .venv && .venv/bin/pip install -q -r requirements-dev.txt -e . && .venv/bin/python -m pytest

CMD [".venv/bin/python", "-m", "ckptlab", "tour"]
