
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#ifndef SECCOMP_FD
#error "SECCOMP_FD (the descriptor bwrap's --seccomp reads) is defined by recorders/launcher.py's build: -DSECCOMP_FD=..."
#endif

/* tttr-launch [-u UID -g GID -s STAGE [-b SRC NAME]...] [-f SECCOMP_FILE] -- PROGRAM ARGS... */

static void die(const char *what, const char *arg) {
    fprintf(stderr, "tttr-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    exit(125);
}

static void usage(void) {
    fputs("usage: tttr-launch [-u UID -g GID -s STAGE [-b SRC NAME]...] [-f SECCOMP] -- PROGRAM ARGS...\n", stderr);
    exit(125);
}

int main(int argc, char **argv) {
    long uid = -1, gid = -1;
    const char *stage = NULL, *seccomp = NULL, *src[16], *name[16];
    int nb = 0, fds[16], i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (i + 1 >= argc) usage();
        if (!strcmp(argv[i], "-u")) uid = atol(argv[++i]);
        else if (!strcmp(argv[i], "-g")) gid = atol(argv[++i]);
        else if (!strcmp(argv[i], "-s")) stage = argv[++i];
        else if (!strcmp(argv[i], "-f")) seccomp = argv[++i];
        else if (!strcmp(argv[i], "-b") && i + 2 < argc && nb < 16) {
            src[nb] = argv[i + 1]; name[nb] = argv[i + 2]; nb++; i += 2;
        } else usage();
    }
    if (i >= argc) usage();
    if (seccomp) {
        int fd = open(seccomp, O_RDONLY | O_CLOEXEC);
        if (fd < 0) die("open", seccomp);
        if (fd == SECCOMP_FD) { if (fcntl(fd, F_SETFD, 0) < 0) die("fcntl", seccomp); }
        else { if (dup2(fd, SECCOMP_FD) < 0) die("dup2", seccomp); close(fd); }
    }
    if (uid >= 0) {
        if (uid == 0 || gid <= 0 || !stage) usage();
        if (unshare(CLONE_NEWNS) < 0) die("unshare", "mount namespace");
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) die("mount", "--make-rprivate /");
        /* opened in the new namespace (a bind source must be one of its mounts), before the
           stage's tmpfs can hide them */
        for (int b = 0; b < nb; b++) {
            fds[b] = open(src[b], O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (fds[b] < 0) die("open", src[b]);
        }
        if (mount("tttr-stage", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") < 0)
            die("mount tmpfs on", stage);
        for (int b = 0; b < nb; b++) {
            char dest[PATH_MAX], proc[64];
            snprintf(dest, sizeof dest, "%s/%s", stage, name[b]);
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", fds[b]);
            if (mkdir(dest, 0755) < 0) die("mkdir", dest);
            if (mount(proc, dest, NULL, MS_BIND, NULL) < 0) die("bind", src[b]);
            close(fds[b]);
        }
        if (setgroups(0, NULL) < 0) die("setgroups", "");
        if (setresgid(gid, gid, gid) < 0) die("setresgid", "");
        if (setresuid(uid, uid, uid) < 0) die("setresuid", "");
        if (getuid() != uid || geteuid() != uid || getgid() != gid) { errno = EPERM; die("drop privileges", ""); }
    }
    execv(argv[i], argv + i);
    die("exec", argv[i]);
    return 125;
}
