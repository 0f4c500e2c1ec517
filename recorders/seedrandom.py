"""The seeded-randomness shim: an LD_PRELOAD library that answers getrandom,
getentropy and arc4random from a stream seeded by (run seed, step, pid).

It is shipped as C source and compiled with the system C compiler on first use into
the cache directory. Seeding by pid as well keeps two processes of one command from
drawing the same bytes, and stays deterministic because PIDs repeat in a fresh PID
namespace when the same processes start.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kernels.cbuild import build_shared

SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static uint64_t tttr_state;
static pid_t tttr_pid;
static int tttr_seeded;

static uint64_t tttr_next(void) {
    uint64_t z = (tttr_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void tttr_fill(void *buf, size_t n) {
    pid_t pid = getpid();
    if (!tttr_seeded || pid != tttr_pid) {
        const char *s = getenv("TTTR_SEED");
        tttr_state = (s ? strtoull(s, NULL, 16) : 0) ^ ((uint64_t)pid * 0xD1B54A32D192ED03ULL);
        tttr_next();
        tttr_pid = pid;
        tttr_seeded = 1;
    }
    unsigned char *p = buf;
    while (n) {
        uint64_t v = tttr_next();
        size_t k = n < 8 ? n : 8;
        memcpy(p, &v, k);
        p += k;
        n -= k;
    }
}

ssize_t getrandom(void *buf, size_t n, unsigned int flags) { (void)flags; tttr_fill(buf, n); return (ssize_t)n; }
int getentropy(void *buf, size_t n) { if (n > 256) { errno = EIO; return -1; } tttr_fill(buf, n); return 0; }
uint32_t arc4random(void) { uint32_t v; tttr_fill(&v, sizeof v); return v; }
void arc4random_buf(void *buf, size_t n) { tttr_fill(buf, n); }
uint32_t arc4random_uniform(uint32_t upper) {
    if (upper < 2) return 0;
    uint32_t min = -upper % upper, v;
    do { v = arc4random(); } while (v < min);
    return v % upper;
}
"""


def build_shim() -> tuple[Path | None, str | None]:
    """(path of the compiled shim, None) or (None, why it could not be built)."""
    return build_shared("seedrandom", SOURCE, ["-shared", "-fPIC", "-O2"], "the randomness shim")


def step_seed(seed: int, step: int) -> int:
    """64-bit seed for one step's command, a function of (run seed, step) only."""
    h = hashlib.sha256(f"tttr-trace:{seed}:{step}".encode()).digest()
    return int.from_bytes(h[:8], "big")
