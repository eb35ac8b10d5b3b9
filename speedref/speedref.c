// SPDX-License-Identifier: Apache-2.0
/* speedref: how fast is this machine right now, on the paths a sidecar's costs are made of?
 *
 * Three fixed workloads, each run in short bursts; the minimum over bursts is reported (the
 * fastest burst is the one least disturbed by other work), with the median beside it:
 *
 *   cross  one-byte ping-pong over loopback TCP between two threads pinned to two CPUs
 *          (syscalls, the TCP stack, a cross-CPU wake-up per message): ns per round trip
 *   local  the same with both threads on one CPU (a context switch per message)
 *   user   a branchy, cache-hungry user-space loop (parse fixed HTTP-like headers into a
 *          hash table): ns per iteration
 *
 * Output: one JSON object on stdout. Usage: speedref [-a CPU] [-b CPU] [-n ROUNDTRIPS]
 * [-k BURSTS]. Exits non-zero with a message on stderr when a socket or thread fails.
 *
 * With -w SECONDS instead: the host's wake-ups. A thread on CPU b blocks on a pipe; one on CPU
 * a spins GAP µs, stamps the time and writes; b takes the time its read returned. For each gap
 * (0, 20, 40, 80, 160 µs; SECONDS spread over them) the share of wake-ups that took 14 µs or
 * more (a halted vCPU woken) and the rate of those that took 130 µs or more (a host stall, as
 * meshtax's probe windows count them, issue #14), per second of the run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_BURSTS 64

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return 0;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void die(const char *what)
{
	fprintf(stderr, "speedref: %s: %s\n", what, strerror(errno));
	exit(1);
}

struct echo {
	int fd;
	int cpu;
	long rounds;
};

static void *echo_thread(void *arg)
{
	struct echo *e = arg;
	char c;
	long i;

	if (pin(e->cpu))
		return (void *)1;
	for (i = 0; i < e->rounds; i++) {
		if (read(e->fd, &c, 1) != 1 || write(e->fd, &c, 1) != 1)
			return (void *)1;
	}
	return NULL;
}

/* a connected loopback TCP pair (the path between an app and its sidecar) */
static void tcp_pair(int fds[2])
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int one = 1, lfd;

	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 1) ||
	    getsockname(lfd, (struct sockaddr *)&a, &len))
		die("listen on loopback");
	fds[0] = socket(AF_INET, SOCK_STREAM, 0);
	if (fds[0] < 0 || connect(fds[0], (struct sockaddr *)&a, sizeof(a)))
		die("connect on loopback");
	fds[1] = accept(lfd, NULL, NULL);
	if (fds[1] < 0)
		die("accept on loopback");
	close(lfd);
	setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ns per round trip of one burst of n one-byte messages, the echo thread on cpu_b */
static double pingpong(int cpu_a, int cpu_b, long n)
{
	struct echo e;
	pthread_t t;
	int fds[2];
	uint64_t t0, t1;
	void *ret;
	char c = 'x';
	long i;

	tcp_pair(fds);
	e.fd = fds[1];
	e.cpu = cpu_b;
	e.rounds = n;
	if (pin(cpu_a) || pthread_create(&t, NULL, echo_thread, &e))
		die("start the echo thread");
	t0 = now_ns();
	for (i = 0; i < n; i++) {
		if (write(fds[0], &c, 1) != 1 || read(fds[0], &c, 1) != 1)
			die("ping-pong");
	}
	t1 = now_ns();
	if (pthread_join(t, &ret) || ret)
		die("echo thread");
	close(fds[0]);
	close(fds[1]);
	return (double)(t1 - t0) / (double)n;
}

/* a fixed user-space job: split header lines, hash names into an open-addressing table */
static const char HEADERS[] =
	"POST /echo?size=100 HTTP/1.1\r\nhost: server.default.svc.cluster.local:8080\r\n"
	"user-agent: fortio.org/fortio-1.68.2\r\ncontent-type: application/octet-stream\r\n"
	"content-length: 100\r\nx-request-id: 4f1c2a7e-9b0d-4c5e-8a61-2d7f3b9e0c11\r\n"
	"x-forwarded-proto: http\r\nx-envoy-expected-rq-timeout-ms: 15000\r\n"
	"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n";

static uint64_t user_job(long iters)
{
	static uint64_t table[4096];
	uint64_t sum = 0;
	long i;

	for (i = 0; i < iters; i++) {
		const char *p = HEADERS;
		while (*p) {
			uint64_t h = 1469598103934665603ull ^ (uint64_t)i;
			const char *line = p;
			while (*p && *p != ':' && *p != '\r')
				h = (h ^ (uint8_t)*p++) * 1099511628211ull;
			while (*p && *p != '\n')
				p++;
			if (*p)
				p++;
			/* open addressing with linear probing: data-dependent branches and loads */
			for (uint64_t k = h & 4095; ; k = (k + 1) & 4095) {
				if (table[k] == 0 || table[k] == h) {
					table[k] = h;
					sum += k + (uint64_t)(p - line);
					break;
				}
			}
		}
		if ((i & 63) == 63) /* at most 64 × 12 of 4096 slots: the probe always ends */
			memset(table, 0, sizeof(table));
	}
	return sum;
}

static double user_burst(long iters)
{
	uint64_t t0 = now_ns();
	volatile uint64_t sink = user_job(iters);
	(void)sink;
	return (double)(now_ns() - t0) / (double)iters;
}

static int wake_pipe[2][2];
struct wake_stats {
	int cpu;
	long wakes, slow, stalls;
	double sum_us;
};

static void *wake_thread(void *arg)
{
	struct wake_stats *st = arg;
	uint64_t t;

	if (pin(st->cpu))
		return (void *)1;
	for (;;) {
		if (read(wake_pipe[0][0], &t, sizeof(t)) != sizeof(t))
			return (void *)1;
		if (t == 0)
			return NULL;
		double us = (double)(now_ns() - t) / 1e3;
		st->wakes++;
		st->sum_us += us;
		st->slow += us >= 14.0;
		st->stalls += us >= 130.0;
		if (write(wake_pipe[1][1], &t, sizeof(t)) != sizeof(t))
			return (void *)1;
	}
}

/* one gap: wake-ups of a thread on cpu_b, each after the waker spun gap_us */
static void wake_gap(int cpu_a, int cpu_b, long gap_us, double seconds, int last)
{
	struct wake_stats st = { .cpu = cpu_b };
	uint64_t t0, t, end, zero = 0;
	pthread_t th;
	void *ret;

	if (pipe(wake_pipe[0]) || pipe(wake_pipe[1]))
		die("pipe");
	if (pin(cpu_a) || pthread_create(&th, NULL, wake_thread, &st))
		die("start the woken thread");
	t0 = now_ns();
	end = t0 + (uint64_t)(seconds * 1e9);
	while (now_ns() < end) {
		uint64_t s = now_ns();

		while (now_ns() - s < (uint64_t)gap_us * 1000)
			;
		t = now_ns();
		if (write(wake_pipe[0][1], &t, sizeof(t)) != sizeof(t) ||
		    read(wake_pipe[1][0], &t, sizeof(t)) != sizeof(t))
			die("wake-up ping-pong");
	}
	if (write(wake_pipe[0][1], &zero, sizeof(zero)) != sizeof(zero) ||
	    pthread_join(th, &ret) || ret)
		die("woken thread");
	double wall = (double)(now_ns() - t0) / 1e9;
	for (int i = 0; i < 2; i++) {
		close(wake_pipe[i][0]);
		close(wake_pipe[i][1]);
	}
	printf("{\"gap_us\": %ld, \"wakes\": %ld, \"mean_us\": %.2f, \"slow_share\": %.4f, "
	       "\"stalls_per_s\": %.2f}%s",
	       gap_us, st.wakes, st.wakes ? st.sum_us / (double)st.wakes : 0.0,
	       st.wakes ? (double)st.slow / (double)st.wakes : 0.0, (double)st.stalls / wall,
	       last ? "" : ", ");
}

static int wake_report(int cpu_a, int cpu_b, double seconds)
{
	static const long gaps[] = { 0, 20, 40, 80, 160 };
	int n = (int)(sizeof(gaps) / sizeof(*gaps));

	printf("{\"version\": 1, \"cpu_a\": %d, \"cpu_b\": %d, \"seconds\": %.1f, \"wake\": [",
	       cpu_a, cpu_b, seconds);
	for (int i = 0; i < n; i++)
		wake_gap(cpu_a, cpu_b, gaps[i], seconds / n, i == n - 1);
	printf("]}\n");
	return 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void report(const char *name, double *v, int k, int last)
{
	qsort(v, (size_t)k, sizeof(*v), cmp);
	printf("\"%s_ns\": %.1f, \"%s_median_ns\": %.1f%s", name, v[0], name, v[k / 2],
	       last ? "" : ", ");
}

int main(int argc, char **argv)
{
	double cross[MAX_BURSTS], local[MAX_BURSTS], user[MAX_BURSTS];
	int cpu_a = -1, cpu_b = -1, k = 7, opt, i;
	long n = 2000;
	double wake_s = -1;

	while ((opt = getopt(argc, argv, "a:b:n:k:w:h")) != -1) {
		switch (opt) {
		case 'a': cpu_a = atoi(optarg); break;
		case 'b': cpu_b = atoi(optarg); break;
		case 'n': n = atol(optarg); break;
		case 'k': k = atoi(optarg); break;
		case 'w':
			wake_s = atof(optarg);
			if (wake_s <= 0 || wake_s > 600) {
				fprintf(stderr, "speedref: -w takes 0 < SECONDS <= 600\n");
				return 2;
			}
			break;
		default:
			fprintf(stderr, "usage: speedref [-a CPU] [-b CPU] [-n ROUNDTRIPS] [-k BURSTS] "
				"| [-a CPU] [-b CPU] -w SECONDS\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	if (k < 1 || k > MAX_BURSTS || n < 1) {
		fprintf(stderr, "speedref: -k must be 1..%d and -n positive\n", MAX_BURSTS);
		return 2;
	}
	if (wake_s > 0)
		return wake_report(cpu_a, cpu_b, wake_s);
	pingpong(cpu_a, cpu_b, n / 4); /* warm: page tables, TCP state, the scheduler's view */
	for (i = 0; i < k; i++) {
		cross[i] = pingpong(cpu_a, cpu_b, n);
		local[i] = pingpong(cpu_b, cpu_b, n);
		user[i] = user_burst(n * 4);
	}
	printf("{\"version\": 1, \"cpu_a\": %d, \"cpu_b\": %d, \"roundtrips\": %ld, \"bursts\": %d, ",
	       cpu_a, cpu_b, n, k);
	report("cross", cross, k, 0);
	report("local", local, k, 0);
	report("user", user, k, 1);
	printf("}\n");
	return 0;
}
