// SPDX-License-Identifier: Apache-2.0
/*
 * sidecar - per-thread Read/Write/Notification/on-CPU and loopback IPC aggregates of a proxy.
 *
 * USAGE: sidecar -p PID[,PID...] [-f NETNS] [-d SECONDS] [-a] [-s] [-v]
 *
 * Runs until SIGINT/SIGTERM or the duration, then prints one JSON object (one line) to stdout.
 * SIGUSR1 prints the totals so far as one such line and keeps running (cumulative: the caller
 * subtracts two snapshots to get a window without re-attaching).
 * Prints "sidecar: ready" to stderr once every program is attached.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "sidecar.h"
#include "sidecar.skel.h"

/* "notify_hist", "sock_ipc", "errqueue", "notify_behind_ns" (threads) and "sock_method"
 * (ipc) were added: optional for readers */
#define FORMAT_VERSION 1
/* the socket IPC programs (no-device delivery: Unix sockets, sockmap-redirected TCP): kernels
 * without these tracepoints (before 6.6) go on without them ("sock_method": "unavailable") */
#define SOCK_METHOD "sk_data_ready->sock_send_length (AF_UNIX, or AF_INET with no device)"

static struct env {
	__u32 pids[MAX_TGIDS];
	int n_pids;
	const char *follow;	/* netns path whose tasks are followed too */
	double duration;	/* seconds; 0 = until a signal */
	bool all_netns;
	bool run_stats;
	bool verbose;
} env;

static bool sock_ipc;	/* both socket IPC programs attached */
static volatile sig_atomic_t exiting;
static volatile sig_atomic_t dump;

static const char usage[] =
"Usage: sidecar -p PID[,PID...] [-f NETNS] [-d SECONDS] [-a] [-s] [-v]\n"
"  -p  target process IDs (thread groups), at most 8\n"
"  -f  also follow every task of this network namespace (e.g. /run/netns/NAME), found on\n"
"      its first syscall: processes started after the probe (a load generator)\n"
"  -d  stop after SECONDS (default: run until SIGINT/SIGTERM)\n"
"  -a  time loopback skbs of every network namespace (default: the first PID's)\n"
"  -s  kernel BPF run-time stats per program (costs two clock reads per event)\n"
"  -v  libbpf debug output\n";

static const char *counter_names[CNT_MAX] = {
	[CNT_THREAD_MAP_FULL] = "thread_map_full",
	[CNT_EXIT_UNMATCHED] = "exit_unmatched",
	[CNT_SKB_MAP_FULL] = "skb_map_full",
	[CNT_SKB_UNMATCHED] = "skb_unmatched",
	[CNT_WAKEUP_NOT_EPOLL] = "wakeup_not_epoll",
};

static void sig_handler(int sig)
{
	if (sig == SIGUSR1)
		dump = 1;
	else
		exiting = 1;
}

static int libbpf_print_fn(enum libbpf_print_level level, const char *format, va_list args)
{
	if (level == LIBBPF_DEBUG && !env.verbose)
		return 0;
	return vfprintf(stderr, format, args);
}

static int parse_args(int argc, char **argv)
{
	char *tok, *save, *end;
	int opt;

	while ((opt = getopt(argc, argv, "p:f:d:asvh")) != -1) {
		switch (opt) {
		case 'p':
			for (tok = strtok_r(optarg, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
				long pid = strtol(tok, &end, 10);

				if (*end || pid <= 0 || pid > 0x7fffffff) {
					fprintf(stderr, "sidecar: invalid PID '%s'\n", tok);
					return -1;
				}
				if (env.n_pids == MAX_TGIDS) {
					fprintf(stderr, "sidecar: at most %d PIDs\n", MAX_TGIDS);
					return -1;
				}
				env.pids[env.n_pids++] = pid;
			}
			break;
		case 'f':
			env.follow = optarg;
			break;
		case 'd':
			env.duration = strtod(optarg, &end);
			if (*end || env.duration < 0) {
				fprintf(stderr, "sidecar: invalid duration '%s'\n", optarg);
				return -1;
			}
			break;
		case 'a':
			env.all_netns = true;
			break;
		case 's':
			env.run_stats = true;
			break;
		case 'v':
			env.verbose = true;
			break;
		default:
			fputs(usage, stderr);
			return -1;
		}
	}
	if (!env.n_pids) {
		fputs("sidecar: -p PID is required\n", stderr);
		fputs(usage, stderr);
		return -1;
	}
	return 0;
}

/* Tracepoint attach needs tracefs for event IDs; mount it in a private mount namespace
 * so it disappears with this process instead of being left behind on the host. */
static int ensure_tracefs(void)
{
	if (!access("/sys/kernel/tracing/events", F_OK) ||
	    !access("/sys/kernel/debug/tracing/events", F_OK))
		return 0;
	if (unshare(CLONE_NEWNS)) {
		fprintf(stderr, "sidecar: tracefs not mounted and unshare(CLONE_NEWNS) failed: %s\n",
			strerror(errno));
		return -1;
	}
	if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
	    mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, NULL)) {
		fprintf(stderr, "sidecar: cannot mount tracefs at /sys/kernel/tracing: %s\n",
			strerror(errno));
		return -1;
	}
	return 0;
}

static __u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (__u64)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int read_comm(__u32 pid, __u32 tid, char *buf, size_t len)
{
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%u/task/%u/comm", pid, tid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(buf, len, f))
		buf[0] = 0;
	buf[strcspn(buf, "\n")] = 0;
	fclose(f);
	return 0;
}

/* Pre-register existing threads so their first switch-in and wakeups are seen. */
static int seed_threads(int map_fd)
{
	char path[64];
	struct dirent *de;
	DIR *dir;

	for (int i = 0; i < env.n_pids; i++) {
		snprintf(path, sizeof(path), "/proc/%u/task", env.pids[i]);
		dir = opendir(path);
		if (!dir) {
			fprintf(stderr, "sidecar: no such process %u: %s\n", env.pids[i],
				strerror(errno));
			return -1;
		}
		while ((de = readdir(dir))) {
			struct thread_stat st = {};
			__u32 tid = strtoul(de->d_name, NULL, 10);

			if (!tid)
				continue;
			st.tgid = env.pids[i];
			st.tid = tid;
			read_comm(env.pids[i], tid, st.comm, sizeof(st.comm));
			/* BPF_NOEXIST: the probe may already have created it */
			if (bpf_map_update_elem(map_fd, &tid, &st, BPF_NOEXIST) && errno != EEXIST) {
				fprintf(stderr, "sidecar: cannot seed thread %u: %s\n", tid,
					strerror(errno));
				closedir(dir);
				return -1;
			}
		}
		closedir(dir);
	}
	return 0;
}

static void print_json_str(const char *s, size_t max)
{
	putchar('"');
	for (size_t i = 0; i < max && s[i]; i++) {
		unsigned char c = s[i];

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20 || c > 0x7e)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void print_op(const char *name, const struct op_stat *op)
{
	printf("\"%s\":{\"count\":%llu,\"ns\":%llu,\"bytes\":%llu,\"errors\":%llu}", name,
	       (unsigned long long)op->count, (unsigned long long)op->ns,
	       (unsigned long long)op->bytes, (unsigned long long)op->errors);
}

static void add_op(struct op_stat *a, const struct op_stat *b)
{
	a->count += b->count;
	a->ns += b->ns;
	a->bytes += b->bytes;
	a->errors += b->errors;
}

static void print_stat_body(const struct thread_stat *st)
{
	print_op("read", &st->read);
	putchar(',');
	print_op("write", &st->write);
	putchar(',');
	print_op("epoll", &st->epoll);
	putchar(',');
	print_op("notify", &st->notify);
	putchar(',');
	print_op("sock_ipc", &st->sock_ipc);
	putchar(',');
	print_op("errqueue", &st->errqueue);
	printf(",\"notify_behind_ns\":%llu", (unsigned long long)st->notify_behind_ns);
	printf(",\"syscalls\":%llu,\"sys_ns\":%llu,\"oncpu_ns\":%llu,\"user_ns\":%llu,"
	       "\"sys_cpu_ns\":%llu,\"unknown_cpu_ns\":%llu,\"switches_in\":%llu",
	       (unsigned long long)st->syscalls, (unsigned long long)st->sys_ns,
	       (unsigned long long)(st->user_ns + st->sys_cpu_ns + st->unknown_cpu_ns),
	       (unsigned long long)st->user_ns, (unsigned long long)st->sys_cpu_ns,
	       (unsigned long long)st->unknown_cpu_ns, (unsigned long long)st->switches_in);
}

/* sparse: [[bin, count, ns], ...] for the non-empty bins (bin width 2^shift ns) */
static void print_notify_hist(const struct thread_stat *st)
{
	bool first = true;

	printf(",\"notify_hist_shift\":%d,\"notify_hist\":[", NOTIFY_BIN_SHIFT);
	for (int i = 0; i < NOTIFY_BINS; i++) {
		if (!st->notify_hist_n[i])
			continue;
		printf("%s[%d,%u,%llu]", first ? "" : ",", i, st->notify_hist_n[i],
		       (unsigned long long)st->notify_hist_ns[i]);
		first = false;
	}
	putchar(']');
}

static int print_threads(int fd, struct thread_stat *total)
{
	__u32 key, next;
	__u32 *prev = NULL;
	struct thread_stat st;
	bool first = true;
	int err;

	printf("\"threads\":[");
	/* the map is small (threads of a few processes): no need for batch ops */
	while (!(err = bpf_map_get_next_key(fd, prev, &next))) {
		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(fd, &key, &st))
			continue;	/* deleted under us */
		/* the seeded comm may predate an exec; prefer the live one */
		read_comm(st.tgid, st.tid, st.comm, sizeof(st.comm));
		printf("%s{\"tid\":%u,\"tgid\":%u,\"followed\":%u,\"comm\":", first ? "" : ",",
		       st.tid, st.tgid, st.followed ? 1 : 0);
		print_json_str(st.comm, sizeof(st.comm));
		putchar(',');
		print_stat_body(&st);
		print_notify_hist(&st);
		putchar('}');
		first = false;
		add_op(&total->read, &st.read);
		add_op(&total->write, &st.write);
		add_op(&total->epoll, &st.epoll);
		add_op(&total->notify, &st.notify);
		add_op(&total->sock_ipc, &st.sock_ipc);
		add_op(&total->errqueue, &st.errqueue);
		total->notify_behind_ns += st.notify_behind_ns;
		total->syscalls += st.syscalls;
		total->sys_ns += st.sys_ns;
		total->user_ns += st.user_ns;
		total->sys_cpu_ns += st.sys_cpu_ns;
		total->unknown_cpu_ns += st.unknown_cpu_ns;
		total->switches_in += st.switches_in;
	}
	printf("]");
	return err == -ENOENT || errno == ENOENT ? 0 : err;
}

static int print_ipc(int fd, int ncpus)
{
	struct ipc_stat vals[ncpus], sum = {};
	__u32 zero = 0;

	if (bpf_map_lookup_elem(fd, &zero, vals))
		return -errno;
	for (int i = 0; i < ncpus; i++) {
		sum.count += vals[i].count;
		sum.ns += vals[i].ns;
		sum.bytes += vals[i].bytes;
		if (vals[i].max_ns > sum.max_ns)
			sum.max_ns = vals[i].max_ns;
	}
	printf("\"ipc\":{\"method\":\"net_dev_queue(lo)->netif_receive_skb(lo)\","
	       "\"count\":%llu,\"ns\":%llu,\"bytes\":%llu,\"max_ns\":%llu,"
	       "\"sock_method\":\"%s\"}",
	       (unsigned long long)sum.count, (unsigned long long)sum.ns,
	       (unsigned long long)sum.bytes, (unsigned long long)sum.max_ns,
	       sock_ipc ? SOCK_METHOD : "unavailable");
	return 0;
}

static int print_counters(int fd, int ncpus)
{
	__u64 vals[ncpus];

	printf("\"counters\":{");
	for (__u32 i = 0; i < CNT_MAX; i++) {
		__u64 sum = 0;

		if (bpf_map_lookup_elem(fd, &i, vals))
			return -errno;
		for (int c = 0; c < ncpus; c++)
			sum += vals[c];
		printf("%s\"%s\":%llu", i ? "," : "", counter_names[i], (unsigned long long)sum);
	}
	printf("}");
	return 0;
}

/* Kernel-side cost of the probe itself; recursion_misses are events the kernel dropped. */
static void print_programs(struct sidecar_bpf *obj)
{
	struct bpf_program *prog;
	bool first = true;

	printf("\"programs\":[");
	bpf_object__for_each_program(prog, obj->obj) {
		struct bpf_prog_info info = {};
		__u32 len = sizeof(info);

		if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len))
			continue;
		printf("%s{\"name\":\"%s\",\"run_cnt\":%llu,\"run_time_ns\":%llu,"
		       "\"recursion_misses\":%llu}", first ? "" : ",", bpf_program__name(prog),
		       (unsigned long long)info.run_cnt, (unsigned long long)info.run_time_ns,
		       (unsigned long long)info.recursion_misses);
		first = false;
	}
	printf("]");
}

/* One JSON object on one line: the cumulative totals since attach. */
static int print_reading(struct sidecar_bpf *obj, __u64 netns, __u64 follow_ino, __u64 duration,
			 int ncpus, int stats_fd)
{
	struct thread_stat total = {};
	int err, rc = 0;

	printf("{\"version\":%d,\"tool\":\"sidecar\",\"pids\":[", FORMAT_VERSION);
	for (int i = 0; i < env.n_pids; i++)
		printf("%s%u", i ? "," : "", env.pids[i]);
	printf("],\"netns\":%llu,\"follow_netns\":%llu,\"duration_ns\":%llu,\"stats_enabled\":%s,",
	       (unsigned long long)netns, (unsigned long long)follow_ino,
	       (unsigned long long)duration,
	       stats_fd >= 0 ? "true" : "false");
	err = print_threads(bpf_map__fd(obj->maps.threads), &total);
	if (err)
		fprintf(stderr, "sidecar: error iterating threads: %d\n", (rc = err));
	printf(",\"total\":{");
	print_stat_body(&total);
	printf("},");
	err = print_ipc(bpf_map__fd(obj->maps.ipc), ncpus);
	if (err)
		fprintf(stderr, "sidecar: cannot read ipc map: %d\n", (rc = err));
	putchar(',');
	err = print_counters(bpf_map__fd(obj->maps.counters), ncpus);
	if (err)
		fprintf(stderr, "sidecar: cannot read counters: %d\n", (rc = err));
	putchar(',');
	print_programs(obj);
	printf("}\n");
	fflush(stdout);
	return rc;
}

int main(int argc, char **argv)
{
	struct sidecar_bpf *obj = NULL;
	struct bpf_program *prog;
	struct bpf_link *links[16] = {};
	int n_links = 0, stats_fd = -1, ncpus, err, sock_links = 0;
	__u64 netns = 0, follow_ino = 0, t_start, deadline;
	struct rlimit rl = { RLIM_INFINITY, RLIM_INFINITY };
	struct sigaction sa = { .sa_handler = sig_handler };
	char path[64];
	struct stat sb;

	if (parse_args(argc, argv))
		return 2;
	libbpf_set_print(libbpf_print_fn);
	/* signals first: a stop request during setup still ends in a clean exit */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);

	/* kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK */
	if (setrlimit(RLIMIT_MEMLOCK, &rl) && env.verbose)
		fprintf(stderr, "sidecar: warning: cannot raise RLIMIT_MEMLOCK: %s\n",
			strerror(errno));
	err = ensure_tracefs();
	if (err)
		goto cleanup;
	if (!env.all_netns) {
		snprintf(path, sizeof(path), "/proc/%u/ns/net", env.pids[0]);
		if (stat(path, &sb)) {
			fprintf(stderr, "sidecar: cannot stat %s: %s\n", path, strerror(errno));
			err = -errno;
			goto cleanup;
		}
		netns = sb.st_ino;
	}
	if (env.follow) {
		if (stat(env.follow, &sb)) {
			fprintf(stderr, "sidecar: cannot stat %s: %s\n", env.follow, strerror(errno));
			err = -errno;
			goto cleanup;
		}
		follow_ino = sb.st_ino;
	}
	ncpus = libbpf_num_possible_cpus();
	if (ncpus < 0) {
		err = ncpus;
		fprintf(stderr, "sidecar: cannot count CPUs: %d\n", err);
		goto cleanup;
	}

	obj = sidecar_bpf__open();
	if (!obj) {
		err = -errno;
		fprintf(stderr, "sidecar: failed to open BPF object: %s\n", strerror(errno));
		goto cleanup;
	}
	for (int i = 0; i < env.n_pids; i++)
		obj->rodata->targ_tgid[i] = env.pids[i];
	obj->rodata->n_tgids = env.n_pids;
	obj->rodata->targ_netns = (__u32)netns;
	obj->rodata->follow_netns = (__u32)follow_ino;

	err = sidecar_bpf__load(obj);
	if (err) {
		fprintf(stderr, "sidecar: failed to load BPF object: %d (run with -v)\n", err);
		goto cleanup;
	}
	/* per-program run time for the overhead report; opt-in because it costs per event */
	if (env.run_stats)
		stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
	if (env.run_stats && stats_fd < 0)
		fprintf(stderr, "sidecar: warning: BPF run-time stats unavailable: %d\n", stats_fd);

	err = seed_threads(bpf_map__fd(obj->maps.threads));
	if (err)
		goto cleanup;

	bpf_object__for_each_program(prog, obj->obj) {
		struct bpf_link *link = bpf_program__attach(prog);
		bool optional = prog == obj->progs.sk_data_ready ||
				prog == obj->progs.sock_send_length;

		if (!link && optional) {
			fprintf(stderr, "sidecar: warning: cannot attach %s (%s): socket IPC "
				"(Unix sockets, sockmap) stays inside Write\n", bpf_program__name(prog), strerror(errno));
			continue;
		}
		if (!link) {
			err = -errno;
			fprintf(stderr, "sidecar: failed to attach %s (%s): %s\n",
				bpf_program__name(prog), bpf_program__section_name(prog),
				strerror(errno));
			goto cleanup;
		}
		links[n_links++] = link;
		sock_links += optional;
	}
	sock_ipc = sock_links == 2;
	t_start = now_ns();
	deadline = env.duration > 0 ? t_start + (__u64)(env.duration * 1e9) : 0;
	fprintf(stderr, "sidecar: ready (%d programs, %d pids, netns %llu)\n", n_links,
		env.n_pids, (unsigned long long)netns);

	while (!exiting && (!deadline || now_ns() < deadline)) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };

		if (dump) {
			dump = 0;
			print_reading(obj, netns, follow_ino, now_ns() - t_start, ncpus, stats_fd);
			continue;
		}
		nanosleep(&ts, NULL);	/* a signal ends the sleep early (EINTR) */
	}

	err = print_reading(obj, netns, follow_ino, now_ns() - t_start, ncpus, stats_fd);

cleanup:
	for (int i = 0; i < n_links; i++)
		bpf_link__destroy(links[i]);
	if (stats_fd >= 0)
		close(stats_fd);
	sidecar_bpf__destroy(obj);
	return err != 0;
}
