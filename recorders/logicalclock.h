
#include <poll.h>
#include <semaphore.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/timeb.h>
#ifndef MONOTONIC_BASE_S
#error "MONOTONIC_BASE_S (the monotonic clock's value at a command's start) is defined by recorders/seedrandom.py's build: -DMONOTONIC_BASE_S=..."
#endif
#ifndef CLOCK_SHARE_FILE
#error "CLOCK_SHARE_FILE (the clock file shared with the host, a string) is defined by recorders/seedrandom.py's build: -DCLOCK_SHARE_FILE=..."
#endif

#define LC_NS 1000000000LL
#define LC_MAX_WAIT (100LL * 365 * 86400 * LC_NS)   /* a deadline past it is "never" */
#define LC_AT "TTTR_LOGICAL_AT="
#define LC_AT_LEN (sizeof LC_AT - 1)
enum { LC_OTHER, LC_REAL, LC_MONO };

static int lc_on;
static int64_t lc_start_s, lc_step;   /* the realtime clock at logical 0, in seconds (to 2999) */
static _Atomic int64_t lc_ns;    /* time this process slept or waited out since its command started */
/* Reads of the realtime and of the monotonic clocks, counted apart: a realtime value then
   depends only on the realtime reads before it (and the waits), never on how many times a
   socket's timeout loop read the monotonic clock, which depends on when data arrived. */
static _Atomic int64_t lc_reads[2];
static pthread_once_t lc_once = PTHREAD_ONCE_INIT;

/* The clock file shared with the host (recorders/logicalclock.py's ClockShare), mapped when
   it is there: [0] the offset (ns) the host adds to every realtime read from now on (a fork
   of a clock site), [1] the last realtime value read by any process, in µs since the epoch
   (the host records it with each model call). */
enum { LC_SHARE_OFFSET, LC_SHARE_LAST, LC_SHARE_WORDS };
static volatile int64_t *lc_share;

static void lc_map_share(void) {
    const char *path = environ ? tttr_lookup(environ, "TTTR_CLOCK_SHARE", 16) : NULL;
    int fd = open(path && *path ? path : CLOCK_SHARE_FILE, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    struct stat st;
    if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= (off_t)(LC_SHARE_WORDS * sizeof(int64_t))) {
        void *m = mmap(NULL, LC_SHARE_WORDS * sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) lc_share = m;
    }
    close(fd);
}

static inline int64_t lc_offset(void) { return lc_share ? lc_share[LC_SHARE_OFFSET] : 0; }

static void lc_init(void) {
    pthread_once(&tttr_pinned_once, tttr_load_pinned);
    const char *name = "TTTR_LOGICAL_CLOCK";
    const char *spec = tttr_pinned_ok ? tttr_pinned_get(name, strlen(name))
                                      : environ ? tttr_lookup(environ, name, strlen(name)) : NULL;
    if (!spec) return;
    char *end;
    long long start = strtoll(spec, &end, 10), step = strtoll(end, &end, 10);
    if (start < 0 || step <= 0) return;
    const char *at = environ ? tttr_lookup(environ, LC_AT, LC_AT_LEN - 1) : NULL;
    long long from = 0, real = 0, mono = 0;  /* "<waited ns>:<realtime reads>:<monotonic reads>" */
    if (at) {
        from = strtoll(at, &end, 10);
        if (*end == ':') real = strtoll(end + 1, &end, 10);
        if (*end == ':') mono = strtoll(end + 1, &end, 10);
    }
    lc_start_s = start;
    lc_step = step;
    atomic_store(&lc_ns, from > 0 ? from : 0);
    atomic_store(&lc_reads[0], real > 0 ? real : 0);
    atomic_store(&lc_reads[1], mono > 0 ? mono : 0);
    lc_map_share();
    lc_on = 1;
}

static inline int lc_active(void) { pthread_once(&lc_once, lc_init); return lc_on; }
/* The logical time a clock of `kind` (LC_REAL or LC_MONO) reads next, or reads now. */
static inline int64_t lc_read(int kind) { return atomic_load(&lc_ns) + (atomic_fetch_add(&lc_reads[kind - 1], 1) + 1) * lc_step; }
static inline int64_t lc_now(int kind) { return atomic_load(&lc_ns) + atomic_load(&lc_reads[kind - 1]) * lc_step; }
static inline void lc_advance(int64_t ns) { if (ns > 0) atomic_fetch_add(&lc_ns, ns); }

static int lc_kind(clockid_t clk) {
    switch (clk) {
    case CLOCK_REALTIME: case CLOCK_REALTIME_COARSE: case CLOCK_TAI: case CLOCK_REALTIME_ALARM:
        return LC_REAL;
    case CLOCK_MONOTONIC: case CLOCK_MONOTONIC_COARSE: case CLOCK_MONOTONIC_RAW: case CLOCK_BOOTTIME:
    case CLOCK_BOOTTIME_ALARM:
        return LC_MONO;
    }
    return LC_OTHER;
}

static inline int lc_valid(const struct timespec *t) { return t && t->tv_nsec >= 0 && t->tv_nsec < LC_NS; }

static int64_t lc_ts_ns(const struct timespec *t) {
    if (t->tv_sec >= LC_MAX_WAIT / LC_NS) return LC_MAX_WAIT;
    if (t->tv_sec <= -LC_MAX_WAIT / LC_NS) return -LC_MAX_WAIT;
    return (int64_t)t->tv_sec * LC_NS + t->tv_nsec;
}

static struct timespec lc_ns_ts(int64_t v) {
    struct timespec t = { (time_t)(v / LC_NS), (long)(v % LC_NS) };
    if (t.tv_nsec < 0) { t.tv_nsec += LC_NS; t.tv_sec--; }
    return t;
}

static inline int64_t lc_base_s(int kind) { return kind == LC_REAL ? lc_start_s : MONOTONIC_BASE_S; }

/* What a clock of `kind` reads at logical time `v`. */
static struct timespec lc_value(int kind, int64_t v) {
    struct timespec t = lc_ns_ts(v);
    t.tv_sec += lc_base_s(kind);
    return t;
}

/* `t` moved by `ns` (the shared offset, within ±LC_MAX_WAIT). */
static struct timespec lc_shift(struct timespec t, int64_t ns) {
    struct timespec d = lc_ns_ts(ns);
    t.tv_sec += d.tv_sec;
    t.tv_nsec += d.tv_nsec;
    if (t.tv_nsec >= LC_NS) { t.tv_nsec -= LC_NS; t.tv_sec++; }
    return t;
}

static inline int64_t lc_offset_capped(void) {
    int64_t off = lc_offset();
    return off > LC_MAX_WAIT ? LC_MAX_WAIT : off < -LC_MAX_WAIT ? -LC_MAX_WAIT : off;
}

/* A read of a clock of `kind`: the next logical value, a realtime one moved by the shared
   offset and told to the host. */
static struct timespec lc_clock_read(int kind) {
    struct timespec t = lc_value(kind, lc_read(kind));
    if (kind != LC_REAL || !lc_share) return t;
    t = lc_shift(t, lc_offset_capped());
    lc_share[LC_SHARE_LAST] = (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
    return t;
}

/* The logical time from now until `t` on a clock of `kind` (negative when past), capped. */
static int64_t lc_until(int kind, const struct timespec *t) {
    int64_t base = lc_base_s(kind), limit = LC_MAX_WAIT / LC_NS;
    if (t->tv_sec > base + limit) return LC_MAX_WAIT;
    if (t->tv_sec < base - limit) return -LC_MAX_WAIT;
    int64_t off = kind == LC_REAL ? lc_offset_capped() : 0;
    return ((int64_t)t->tv_sec - base) * LC_NS + t->tv_nsec - lc_now(kind) - off;
}

static int64_t lc_cap(int64_t ns) { return ns < 0 ? 0 : ns > LC_MAX_WAIT ? LC_MAX_WAIT : ns; }

static int64_t lc_real(clockid_t clk) {
    struct timespec t = { 0, 0 };
    int e = errno;
    syscall(SYS_clock_gettime, clk, &t);
    errno = e;
    return lc_ts_ns(&t);
}

/* The next definition (libfaketime's, else libc's) or libc's own, looked up once. */
static void *lc_sym(const char *name, int libc) {
    static void *handle;
    if (libc && !handle) handle = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void *f = libc && handle ? dlsym(handle, name) : NULL;
    return f ? f : dlsym(RTLD_NEXT, name);
}
#define LC_FN(name, libc) ({ static __typeof__(name) *f_; \
    if (!f_) { f_ = (__typeof__(name) *)lc_sym(#name, libc); } f_; })
#define NEXT(name) LC_FN(name, 0)
#define LIBC(name) LC_FN(name, 1)

/* ---- reading the clock ---- */

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int kind = lc_active() ? lc_kind(clk) : LC_OTHER;
    if (kind == LC_OTHER) return NEXT(clock_gettime)(clk, ts);
    *ts = lc_clock_read(kind);
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    if (!lc_active()) return NEXT(gettimeofday)(tv, tz);
    struct timespec t = lc_clock_read(LC_REAL);
    tv->tv_sec = t.tv_sec;
    tv->tv_usec = (suseconds_t)(t.tv_nsec / 1000);
    if (tz) memset(tz, 0, sizeof(struct timezone));
    return 0;
}

time_t time(time_t *out) {
    if (!lc_active()) return NEXT(time)(out);
    time_t v = lc_clock_read(LC_REAL).tv_sec;
    if (out) *out = v;
    return v;
}

int ftime(struct timeb *tb) {
    if (!lc_active()) return NEXT(ftime)(tb);
    struct timespec t = lc_clock_read(LC_REAL);
    tb->time = t.tv_sec;
    tb->millitm = (unsigned short)(t.tv_nsec / 1000000);
    tb->timezone = 0;
    tb->dstflag = 0;
    return 0;
}

int timespec_get(struct timespec *ts, int base) {
    if (!lc_active() || base != TIME_UTC) return NEXT(timespec_get)(ts, base);
    *ts = lc_clock_read(LC_REAL);
    return base;
}

/* ---- sleeping ---- */

/* Really sleep `ns` on the real monotonic clock, then add what was slept: all of it, or
   what an interrupting signal left unslept subtracted. 0 or the error number. */
static int lc_sleep(int64_t ns, int64_t *left) {
    struct timespec req = lc_ns_ts(ns), rem = { 0, 0 };
    int err = LIBC(clock_nanosleep)(CLOCK_MONOTONIC, 0, &req, &rem);
    int64_t rest = err == EINTR ? lc_ts_ns(&rem) : err ? ns : 0;
    lc_advance(ns - rest);
    if (left) *left = rest;
    return err;
}

int nanosleep(const struct timespec *req, struct timespec *rem) {
    if (!lc_active()) return NEXT(nanosleep)(req, rem);
    if (!lc_valid(req) || req->tv_sec < 0) { errno = EINVAL; return -1; }
    int64_t left;
    int err = lc_sleep(lc_ts_ns(req), &left);
    if (!err) return 0;
    if (rem && err == EINTR) *rem = lc_ns_ts(left);
    errno = err;
    return -1;
}

/* Outside the logical clock: libfaketime 0.9.10 answers clock_nanosleep(CLOCK_MONOTONIC,
   TIMER_ABSTIME, ...), which Python's time.sleep() uses, with EINVAL when the monotonic
   clock is not faked. In the sandbox it is real (FAKETIME_DONT_FAKE_MONOTONIC=1), so such a
   sleep needs no translation and goes straight to the kernel; any other goes on to
   libfaketime. */
int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    int kind = lc_active() ? lc_kind(clk) : LC_OTHER;
    if (kind != LC_OTHER) {
        if (!lc_valid(req)) return EINVAL;
        int64_t ns = flags & TIMER_ABSTIME ? lc_until(kind, req) : lc_ts_ns(req);
        if (ns <= 0) return 0;
        int64_t left;
        int err = lc_sleep(lc_cap(ns), &left);
        if (err == EINTR && rem && !(flags & TIMER_ABSTIME)) *rem = lc_ns_ts(left);
        return err;
    }
    if (clk == CLOCK_MONOTONIC || clk == CLOCK_MONOTONIC_RAW || clk == CLOCK_BOOTTIME) {
        const char *real = getenv("FAKETIME_DONT_FAKE_MONOTONIC");
        if (real && real[0] == '1' && !real[1]) {
            long r = syscall(SYS_clock_nanosleep, clk, flags, req, rem);
            return r < 0 ? errno : 0;
        }
    }
    __typeof__(clock_nanosleep) *next = NEXT(clock_nanosleep);
    return next ? next(clk, flags, req, rem) : ENOSYS;
}

int usleep(useconds_t us) {
    if (!lc_active()) return NEXT(usleep)(us);
    int err = lc_sleep((int64_t)us * 1000, NULL);
    if (!err) return 0;
    errno = err;
    return -1;
}

unsigned int sleep(unsigned int s) {
    if (!lc_active()) return NEXT(sleep)(s);
    int64_t left;
    if (!lc_sleep((int64_t)s * LC_NS, &left)) return 0;
    return (unsigned int)(left / LC_NS + (left % LC_NS >= LC_NS / 2));
}

/* ---- waits with a relative timeout ---- */

#define PASS(name) (lc_on ? LIBC(name) : NEXT(name))

/* After a wait of at most `ns` begun at real monotonic `t0`: a timeout adds `ns`, an
   interruption the time really waited. */
static void lc_waited(int timed_out, int interrupted, int64_t ns, int64_t t0) {
    if (timed_out) {
        lc_advance(ns);
    } else if (interrupted) {
        int64_t t = lc_real(CLOCK_MONOTONIC) - t0;
        lc_advance(t < ns ? t : ns);
    }
}

#define LC_RELATIVE(call, ns)                                                      \
    int64_t ns_ = (ns), t0_ = lc_real(CLOCK_MONOTONIC);                            \
    int r_ = (call);                                                               \
    int e_ = errno;                                                                \
    lc_waited(r_ == 0, r_ < 0 && e_ == EINTR, ns_, t0_);                           \
    errno = e_;                                                                    \
    return r_

int poll(struct pollfd *fds, nfds_t n, int ms) {
    if (!lc_active() || ms <= 0) return PASS(poll)(fds, n, ms);
    LC_RELATIVE(LIBC(poll)(fds, n, ms), (int64_t)ms * 1000000);
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask) {
    if (!lc_active() || !lc_valid(ts)) return PASS(ppoll)(fds, n, ts, mask);
    LC_RELATIVE(LIBC(ppoll)(fds, n, ts, mask), lc_ts_ns(ts));
}

int select(int n, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv) {
    if (!lc_active() || !tv || tv->tv_sec < 0 || tv->tv_usec < 0) return PASS(select)(n, r, w, x, tv);
    int64_t ns = tv->tv_sec >= LC_MAX_WAIT / LC_NS ? LC_MAX_WAIT : (int64_t)tv->tv_sec * LC_NS + tv->tv_usec * 1000;
    LC_RELATIVE(LIBC(select)(n, r, w, x, tv), ns);
}

int pselect(int n, fd_set *r, fd_set *w, fd_set *x, const struct timespec *ts, const sigset_t *mask) {
    if (!lc_active() || !lc_valid(ts)) return PASS(pselect)(n, r, w, x, ts, mask);
    LC_RELATIVE(LIBC(pselect)(n, r, w, x, ts, mask), lc_ts_ns(ts));
}

int epoll_wait(int fd, struct epoll_event *ev, int max, int ms) {
    if (!lc_active() || ms <= 0) return PASS(epoll_wait)(fd, ev, max, ms);
    LC_RELATIVE(LIBC(epoll_wait)(fd, ev, max, ms), (int64_t)ms * 1000000);
}

int epoll_pwait(int fd, struct epoll_event *ev, int max, int ms, const sigset_t *mask) {
    if (!lc_active() || ms <= 0) return PASS(epoll_pwait)(fd, ev, max, ms, mask);
    LC_RELATIVE(LIBC(epoll_pwait)(fd, ev, max, ms, mask), (int64_t)ms * 1000000);
}

#if __GLIBC_PREREQ(2, 35)
int epoll_pwait2(int fd, struct epoll_event *ev, int max, const struct timespec *ts, const sigset_t *mask) {
    if (!lc_active() || !lc_valid(ts)) return PASS(epoll_pwait2)(fd, ev, max, ts, mask);
    LC_RELATIVE(LIBC(epoll_pwait2)(fd, ev, max, ts, mask), lc_ts_ns(ts));
}
#endif

int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *ts) {
    if (!lc_active() || !lc_valid(ts)) return PASS(sigtimedwait)(set, info, ts);
    int64_t ns = lc_ts_ns(ts), t0 = lc_real(CLOCK_MONOTONIC);
    int r = LIBC(sigtimedwait)(set, info, ts), e = errno;
    lc_waited(r < 0 && e == EAGAIN, r < 0 && e == EINTR, ns, t0);
    errno = e;
    return r;
}

/* ---- waits until a deadline ---- */

/* The logical deadline `abs` on `clk` as a deadline on the real clock `real_clk`;
   `*left`: the logical time until it. */
static struct timespec lc_deadline(clockid_t clk, const struct timespec *abs, clockid_t real_clk, int64_t *left) {
    *left = lc_cap(lc_until(lc_kind(clk), abs));
    return lc_ns_ts(lc_real(real_clk) + *left);
}

/* Whether `ret` lies in CPython's core (libpython or the python executable), whose only
   pthread_cond_timedwait is the GIL's switch-interval wait. */
static int lc_in_python(void *ret) {
    static void *core;
    Dl_info info;
    if (!core) {
        void *f = dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
        if (f && dladdr(f, &info)) core = info.dli_fbase;
    }
    return core && dladdr(ret, &info) && info.dli_fbase == core;
}

int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t clk, const struct timespec *abs) {
    if (!lc_active() || lc_kind(clk) == LC_OTHER || !lc_valid(abs)) return PASS(pthread_cond_clockwait)(c, m, clk, abs);
    int64_t left;
    struct timespec real = lc_deadline(clk, abs, CLOCK_MONOTONIC, &left);
    int err = LIBC(pthread_cond_clockwait)(c, m, CLOCK_MONOTONIC, &real);
    if (err == ETIMEDOUT) lc_advance(left);
    return err;
}

int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *abs) {
    if (!lc_active() || !lc_valid(abs)) return PASS(pthread_cond_timedwait)(c, m, abs);
    /* glibc keeps a condvar's clock (pthread_condattr_setclock) in bit 1 of __wrefs */
    clockid_t clk = c->__data.__wrefs & 2 ? CLOCK_MONOTONIC : CLOCK_REALTIME;
    int64_t left;
    struct timespec real = lc_deadline(clk, abs, CLOCK_MONOTONIC, &left);
    int err = LIBC(pthread_cond_clockwait)(c, m, CLOCK_MONOTONIC, &real);
    if (err == ETIMEDOUT && !lc_in_python(__builtin_return_address(0))) lc_advance(left);
    return err;
}

static int lc_sem(sem_t *s, clockid_t clk, const struct timespec *abs) {
    int64_t left;
    struct timespec real = lc_deadline(clk, abs, CLOCK_MONOTONIC, &left);
    int r = LIBC(sem_clockwait)(s, CLOCK_MONOTONIC, &real);
    if (r < 0 && errno == ETIMEDOUT) lc_advance(left);
    return r;
}

int sem_timedwait(sem_t *s, const struct timespec *abs) {
    if (!lc_active() || !lc_valid(abs)) return PASS(sem_timedwait)(s, abs);
    return lc_sem(s, CLOCK_REALTIME, abs);
}

int sem_clockwait(sem_t *s, clockid_t clk, const struct timespec *abs) {
    if (!lc_active() || lc_kind(clk) == LC_OTHER || !lc_valid(abs)) return PASS(sem_clockwait)(s, clk, abs);
    return lc_sem(s, clk, abs);
}

/* Mutexes wait on the real realtime clock: a priority-inheritance mutex takes no other. */
static int lc_mutex(pthread_mutex_t *m, clockid_t clk, const struct timespec *abs) {
    int64_t left;
    struct timespec real = lc_deadline(clk, abs, CLOCK_REALTIME, &left);
    int err = LIBC(pthread_mutex_timedlock)(m, &real);
    if (err == ETIMEDOUT) lc_advance(left);
    return err;
}

int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *abs) {
    if (!lc_active() || !lc_valid(abs)) return PASS(pthread_mutex_timedlock)(m, abs);
    return lc_mutex(m, CLOCK_REALTIME, abs);
}

int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t clk, const struct timespec *abs) {
    if (!lc_active() || lc_kind(clk) == LC_OTHER || !lc_valid(abs)) return PASS(pthread_mutex_clocklock)(m, clk, abs);
    return lc_mutex(m, clk, abs);
}

static int lc_rwlock(pthread_rwlock_t *rw, int write, clockid_t clk, const struct timespec *abs) {
    int64_t left;
    struct timespec real = lc_deadline(clk, abs, CLOCK_MONOTONIC, &left);
    int err = write ? LIBC(pthread_rwlock_clockwrlock)(rw, CLOCK_MONOTONIC, &real)
                    : LIBC(pthread_rwlock_clockrdlock)(rw, CLOCK_MONOTONIC, &real);
    if (err == ETIMEDOUT) lc_advance(left);
    return err;
}

int pthread_rwlock_timedrdlock(pthread_rwlock_t *rw, const struct timespec *abs) {
    if (!lc_active() || !lc_valid(abs)) return PASS(pthread_rwlock_timedrdlock)(rw, abs);
    return lc_rwlock(rw, 0, CLOCK_REALTIME, abs);
}

int pthread_rwlock_timedwrlock(pthread_rwlock_t *rw, const struct timespec *abs) {
    if (!lc_active() || !lc_valid(abs)) return PASS(pthread_rwlock_timedwrlock)(rw, abs);
    return lc_rwlock(rw, 1, CLOCK_REALTIME, abs);
}

int pthread_rwlock_clockrdlock(pthread_rwlock_t *rw, clockid_t clk, const struct timespec *abs) {
    if (!lc_active() || lc_kind(clk) == LC_OTHER || !lc_valid(abs)) return PASS(pthread_rwlock_clockrdlock)(rw, clk, abs);
    return lc_rwlock(rw, 0, clk, abs);
}

int pthread_rwlock_clockwrlock(pthread_rwlock_t *rw, clockid_t clk, const struct timespec *abs) {
    if (!lc_active() || lc_kind(clk) == LC_OTHER || !lc_valid(abs)) return PASS(pthread_rwlock_clockwrlock)(rw, clk, abs);
    return lc_rwlock(rw, 1, clk, abs);
}

/* ---- children: a new program continues from its parent's logical time ---- */

/* The exec family's next definitions, looked up when the process starts: a vfork child, or
   a fork child of a threaded parent, must not be the first to take the loader's lock. */
#define LC_EXEC_FNS(X) X(execve) X(execvpe) X(fexecve) X(posix_spawn) X(posix_spawnp) X(system) X(popen)
#define LC_EXEC_DECLARE(name) static __typeof__(name) *lc_next_##name;
LC_EXEC_FNS(LC_EXEC_DECLARE)
#define LC_EXEC_LOOKUP(name) (lc_next_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name))
#define LC_EXEC_RESOLVE(name) LC_EXEC_LOOKUP(name);
#define EXEC_NEXT(name) ({ if (!lc_next_##name) { LC_EXEC_LOOKUP(name); } lc_next_##name; })
#if __GLIBC_PREREQ(2, 34)
static __typeof__(execveat) *lc_next_execveat;
#endif

static void lc_process_start(void) {
    lc_active();
    LC_EXEC_FNS(LC_EXEC_RESOLVE)
#if __GLIBC_PREREQ(2, 34)
    LC_EXEC_RESOLVE(execveat)
#endif
}

#define LC_AT_SIZE (LC_AT_LEN + 3 * 21)

/* "TTTR_LOGICAL_AT=<waited ns>:<realtime reads>:<monotonic reads>" into `buf` (LC_AT_SIZE
   bytes); no allocation, no stdio: it runs in vfork children. */
static char *lc_at_entry(char *buf) {
    uint64_t values[3] = { (uint64_t)atomic_load(&lc_ns), (uint64_t)atomic_load(&lc_reads[0]),
                           (uint64_t)atomic_load(&lc_reads[1]) };
    size_t k = LC_AT_LEN;
    memcpy(buf, LC_AT, LC_AT_LEN);
    for (int j = 0; j < 3; j++) {
        char digits[21];
        int n = 0;
        uint64_t v = values[j];
        do { digits[n++] = (char)('0' + v % 10); v /= 10; } while (v);
        if (j) buf[k++] = ':';
        for (int i = 0; i < n; i++) buf[k++] = digits[n - 1 - i];
    }
    buf[k] = 0;
    return buf;
}

static size_t lc_count(char *const *v) { size_t n = 0; if (v) while (v[n]) n++; return n; }

/* `envp` without any TTTR_LOGICAL_AT, then `at`, into `out` (room for lc_count(envp) + 2). */
static char **lc_env(char *const *envp, char **out, char *at) {
    size_t k = 0;
    if (envp) for (; *envp; envp++) if (strncmp(*envp, LC_AT, LC_AT_LEN)) out[k++] = *envp;
    out[k++] = at;
    out[k] = NULL;
    return out;
}

/* On the stack, so that a vfork child may call it: `name`, the environment to pass on. */
#define LC_CHILD_ENV(name, envp) \
    char name##_at[LC_AT_SIZE]; char *name[lc_count(envp) + 2]; lc_env(envp, name, lc_at_entry(name##_at))

static int lc_execve(const char *path, char *const argv[], char *const envp[]) {
    if (!lc_active()) return EXEC_NEXT(execve)(path, argv, envp);
    LC_CHILD_ENV(env, envp);
    return EXEC_NEXT(execve)(path, argv, env);
}

static int lc_execvpe(const char *file, char *const argv[], char *const envp[]) {
    if (!lc_active()) return EXEC_NEXT(execvpe)(file, argv, envp);
    LC_CHILD_ENV(env, envp);
    return EXEC_NEXT(execvpe)(file, argv, env);
}

int execve(const char *path, char *const argv[], char *const envp[]) { return lc_execve(path, argv, envp); }
int execv(const char *path, char *const argv[]) { return lc_execve(path, argv, environ); }
int execvpe(const char *file, char *const argv[], char *const envp[]) { return lc_execvpe(file, argv, envp); }
int execvp(const char *file, char *const argv[]) { return lc_execvpe(file, argv, environ); }

int fexecve(int fd, char *const argv[], char *const envp[]) {
    if (!lc_active()) return EXEC_NEXT(fexecve)(fd, argv, envp);
    LC_CHILD_ENV(env, envp);
    return EXEC_NEXT(fexecve)(fd, argv, env);
}

#if __GLIBC_PREREQ(2, 34)
int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
    if (!lc_active()) return EXEC_NEXT(execveat)(dirfd, path, argv, envp, flags);
    LC_CHILD_ENV(env, envp);
    return EXEC_NEXT(execveat)(dirfd, path, argv, env, flags);
}
#endif

/* execl, execlp, execle: their arguments as an argv on the stack, then as execv* */
#define LC_ARGV(argv, arg0, ap)                                                       \
    size_t n_ = 1;                                                                    \
    va_start(ap, arg0);                                                               \
    while (va_arg(ap, char *)) n_++;                                                  \
    va_end(ap);                                                                       \
    char *argv[n_ + 1];                                                               \
    argv[0] = (char *)arg0;                                                           \
    va_start(ap, arg0);                                                               \
    for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = va_arg(ap, char *)

int execl(const char *path, const char *arg0, ...) {
    va_list ap;
    LC_ARGV(argv, arg0, ap);
    va_end(ap);
    return lc_execve(path, argv, environ);
}

int execlp(const char *file, const char *arg0, ...) {
    va_list ap;
    LC_ARGV(argv, arg0, ap);
    va_end(ap);
    return lc_execvpe(file, argv, environ);
}

int execle(const char *path, const char *arg0, ...) {
    va_list ap;
    LC_ARGV(argv, arg0, ap);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return lc_execve(path, argv, envp);
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                char *const argv[], char *const envp[]) {
    if (!lc_active()) return EXEC_NEXT(posix_spawn)(pid, path, fa, attr, argv, envp);
    LC_CHILD_ENV(env, envp);
    return EXEC_NEXT(posix_spawn)(pid, path, fa, attr, argv, env);
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                 char *const argv[], char *const envp[]) {
    if (!lc_active()) return EXEC_NEXT(posix_spawnp)(pid, file, fa, attr, argv, envp);
    LC_CHILD_ENV(env, envp);
    return EXEC_NEXT(posix_spawnp)(pid, file, fa, attr, argv, env);
}

/* system() and popen() spawn /bin/sh inside libc, with the process's environment: the
   logical time goes into it for the spawn. */
static void lc_put_at(void) {
    char buf[LC_AT_SIZE];
    setenv("TTTR_LOGICAL_AT", lc_at_entry(buf) + LC_AT_LEN, 1);
}

int system(const char *cmd) {
    if (!lc_active() || !cmd) return EXEC_NEXT(system)(cmd);
    lc_put_at();
    int r = EXEC_NEXT(system)(cmd);
    unsetenv("TTTR_LOGICAL_AT");
    return r;
}

FILE *popen(const char *cmd, const char *mode) {
    if (!lc_active()) return EXEC_NEXT(popen)(cmd, mode);
    lc_put_at();
    FILE *f = EXEC_NEXT(popen)(cmd, mode);
    unsetenv("TTTR_LOGICAL_AT");
    return f;
}
