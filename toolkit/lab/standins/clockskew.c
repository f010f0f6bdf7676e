/* Lab stand-in: a host whose wall clock is set apart from the controller's (`toolkit lab up --clock-skew-ms`).
 *
 * The lab's hosts share this machine's kernel and its CLOCK_REALTIME, and a time namespace offsets only the
 * monotonic and boot-time clocks. So this library, preloaded into every process of the host (/etc/ld.so.preload
 * in its root), adds the offset in /etc/lab-standin/clock-skew-ns to what the wall-clock calls return:
 * clock_gettime's CLOCK_REALTIME (and _COARSE), gettimeofday and time. The monotonic clocks and every sleep or
 * timed wait stay the kernel's own: libfaketime 0.9.10 (Debian 12), which fakes those too, made Python's
 * time.sleep fail with EINVAL and Event.wait(timeout) hang on this machine. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long skew_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void lab_clock_skew_init(void) {
    char buf[32] = {0};
    int fd = open("/etc/lab-standin/clock-skew-ns", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, buf, sizeof(buf) - 1) > 0)
            skew_ns = strtoll(buf, NULL, 10);
        close(fd);
    }
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew_ns;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    if (!real_clock_gettime)
        lab_clock_skew_init();
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0)
        return 0;
    return base;
}
