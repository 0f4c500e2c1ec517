
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <dlfcn.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#ifndef PINNED_FILE
#error "PINNED_FILE (the pinned variables' file, a string) is defined by recorders/seedrandom.py's build: -DPINNED_FILE=..."
#endif

extern char **environ;
static char tttr_pinned[8192];
static int tttr_pinned_ok;
static pthread_once_t tttr_pinned_once = PTHREAD_ONCE_INIT;

static void tttr_load_pinned(void) {
    int fd = open(PINNED_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, tttr_pinned, sizeof tttr_pinned - 1);
    close(fd);
    if (n <= 0) return;
    tttr_pinned[n] = 0;
    for (ssize_t i = 0; i < n; i++) if (tttr_pinned[i] == '\n') tttr_pinned[i] = 0;
    tttr_pinned_ok = 1;
}

static int tttr_is_pinned(const char *name) {
    return !strncmp(name, "FAKE", 4) || !strncmp(name, "DONT_FAKE", 9) || !strncmp(name, "NO_FAKE", 7)
        || !strcmp(name, "TTTR_SEED") || !strcmp(name, "TTTR_LOGICAL_CLOCK");
}

static char *tttr_lookup(char *const *entries, const char *name, size_t len) {
    for (; *entries; entries++)
        if (!strncmp(*entries, name, len) && (*entries)[len] == '=') return *entries + len + 1;
    return NULL;
}

static char *tttr_pinned_get(const char *name, size_t len) {
    char *p = tttr_pinned, *end = tttr_pinned + sizeof tttr_pinned;
    while (p < end && *p) {
        if (!strncmp(p, name, len) && p[len] == '=') return p + len + 1;
        p += strlen(p) + 1;
    }
    return NULL;
}

static void lc_process_start(void);

/* Before main (and before libfaketime reads them, the shim being first in the preload
   order): the environment's clock and seed variables become the pinned ones, and those
   the sandbox does not pin are dropped; for programs such as bash that define their own
   getenv(), which libfaketime's calls reach instead of ours. The logical time a parent
   passed (TTTR_LOGICAL_AT) is read, then dropped: the program never sees it. */
__attribute__((constructor)) static void tttr_pin_environ(void) {
    pthread_once(&tttr_pinned_once, tttr_load_pinned);
    lc_process_start();
    if (!environ) return;
    char **out = environ;
    for (char **e = environ; *e; e++) {
        if (!strncmp(*e, "TTTR_LOGICAL_AT=", 16)) continue;
        char *eq = strchr(*e, '=');
        if (eq && tttr_pinned_ok) {
            char name[128];
            size_t len = (size_t)(eq - *e);
            if (len < sizeof name) {
                memcpy(name, *e, len);
                name[len] = 0;
                if (tttr_is_pinned(name)) {
                    char *v = tttr_pinned_get(name, len);
                    if (!v) continue;        /* not pinned: dropped */
                    *out++ = v - len - 1;    /* "NAME=value" inside tttr_pinned */
                    continue;
                }
            }
        }
        *out++ = *e;
    }
    *out = NULL;
}

char *getenv(const char *name) {
    size_t len = strlen(name);
    if (tttr_is_pinned(name)) {
        pthread_once(&tttr_pinned_once, tttr_load_pinned);
        if (tttr_pinned_ok) return tttr_pinned_get(name, len);
    }
    return environ ? tttr_lookup(environ, name, len) : NULL;
}

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

#include "logicalclock.h"
