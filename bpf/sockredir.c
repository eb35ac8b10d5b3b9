// SPDX-License-Identifier: Apache-2.0
/*
 * sockredir - redirect data between local TCP sockets of one cgroup (sockmap / sk_msg).
 *
 * USAGE: sockredir -c CGROUP [-d SECONDS] [-v]
 *
 * Attaches the sockops program to the cgroup-v2 directory CGROUP (sockets of its processes
 * established from then on are redirected) and the sk_msg program to the sockhash. Prints
 * "sockredir: ready" to stderr once both are attached; on SIGINT/SIGTERM or after the duration
 * prints its counters as one JSON line to stdout, detaches and exits. When the kernel refuses
 * a step, it says which step and the error, and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "sockredir.h"
#include "sockredir.skel.h"

static struct env {
	const char *cgroup;
	double duration;
	bool verbose;
} env;

static volatile sig_atomic_t exiting;

static const char usage[] =
"Usage: sockredir -c CGROUP [-d SECONDS] [-v]\n"
"  -c  cgroup-v2 directory whose TCP sockets are redirected (e.g. /sys/fs/cgroup/unified/x)\n"
"  -d  stop after SECONDS (default: run until SIGINT/SIGTERM)\n"
"  -v  libbpf debug output\n";

static const char *counter_names[CNT_MAX] = {
	[CNT_SOCKS_ADDED] = "socks_added",
	[CNT_ADD_FAILED] = "add_failed",
	[CNT_MSG_REDIRECTED] = "msg_redirected",
	[CNT_MSG_PASSED] = "msg_passed",
};

static void sig_handler(int sig)
{
	(void)sig;
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
	char *end;
	int opt;

	while ((opt = getopt(argc, argv, "c:d:vh")) != -1) {
		switch (opt) {
		case 'c':
			env.cgroup = optarg;
			break;
		case 'd':
			env.duration = strtod(optarg, &end);
			if (*end || env.duration < 0) {
				fprintf(stderr, "sockredir: invalid duration '%s'\n", optarg);
				return -1;
			}
			break;
		case 'v':
			env.verbose = true;
			break;
		case 'h':
			fputs(usage, stdout);
			exit(0);
		default:
			fputs(usage, stderr);
			return -1;
		}
	}
	if (!env.cgroup) {
		fputs("sockredir: -c CGROUP is required\n", stderr);
		fputs(usage, stderr);
		return -1;
	}
	return 0;
}

static int print_counters(int map_fd)
{
	int ncpus = libbpf_num_possible_cpus();
	__u64 *vals;

	if (ncpus <= 0)
		return -1;
	vals = calloc(ncpus, sizeof(*vals));
	if (!vals)
		return -1;
	printf("{\"format\": 1");
	for (__u32 c = 0; c < CNT_MAX; c++) {
		__u64 sum = 0;

		if (bpf_map_lookup_elem(map_fd, &c, vals))
			memset(vals, 0, ncpus * sizeof(*vals));
		for (int i = 0; i < ncpus; i++)
			sum += vals[i];
		printf(", \"%s\": %llu", counter_names[c], (unsigned long long)sum);
	}
	printf("}\n");
	fflush(stdout);
	free(vals);
	return 0;
}

int main(int argc, char **argv)
{
	struct sockredir_bpf *skel = NULL;
	struct bpf_link *ops_link = NULL;
	bool msg_attached = false;
	int cg_fd = -1, map_fd, msg_fd, err = 1;
	double waited = 0;

	if (parse_args(argc, argv))
		return 2;
	libbpf_set_print(libbpf_print_fn);
	signal(SIGINT, sig_handler);
	signal(SIGTERM, sig_handler);

	cg_fd = open(env.cgroup, O_RDONLY | O_DIRECTORY);
	if (cg_fd < 0) {
		fprintf(stderr, "sockredir: open cgroup %s: %s\n", env.cgroup, strerror(errno));
		goto cleanup;
	}
	skel = sockredir_bpf__open_and_load();
	if (!skel) {
		fprintf(stderr, "sockredir: load: %s\n", strerror(errno));
		goto cleanup;
	}
	map_fd = bpf_map__fd(skel->maps.socks);
	msg_fd = bpf_program__fd(skel->progs.sockredir_msg);
	/* libbpf 1.1 has no sk_msg link: the classic attach to the map, detached below */
	if (bpf_prog_attach(msg_fd, map_fd, BPF_SK_MSG_VERDICT, 0)) {
		fprintf(stderr, "sockredir: attach sk_msg to the sockhash: %s\n", strerror(errno));
		goto cleanup;
	}
	msg_attached = true;
	ops_link = bpf_program__attach_cgroup(skel->progs.sockredir_sockops, cg_fd);
	if (!ops_link) {
		fprintf(stderr, "sockredir: attach sockops to cgroup %s: %s\n", env.cgroup,
			strerror(errno));
		goto cleanup;
	}
	fprintf(stderr, "sockredir: ready\n");
	while (!exiting && (!env.duration || waited < env.duration)) {
		usleep(100000);
		waited += 0.1;
	}
	err = print_counters(bpf_map__fd(skel->maps.counters)) ? 1 : 0;
cleanup:
	bpf_link__destroy(ops_link);
	if (msg_attached)
		bpf_prog_detach2(msg_fd, map_fd, BPF_SK_MSG_VERDICT);
	sockredir_bpf__destroy(skel);
	if (cg_fd >= 0)
		close(cg_fd);
	return err;
}
