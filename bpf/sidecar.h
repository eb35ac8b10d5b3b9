/* SPDX-License-Identifier: Apache-2.0 */
/* Shared between sidecar.bpf.c and the sidecar loader: per-thread aggregates. */
#ifndef __SIDECAR_H
#define __SIDECAR_H

#define MAX_TGIDS	8
#define MAX_THREADS	4096
#define MAX_INFLIGHT_SKBS	16384
#define MAX_CPUS	256	/* the watched proxy's busy time is kept per CPU id */
#define TASK_COMM_LEN	16
/* Notification histogram: per-event wake-up -> epoll return latency in bins of
 * 2^NOTIFY_BIN_SHIFT ns (1.024 us), the last bin open-ended, with the exact ns of each bin,
 * so the profile can take robust per-event statistics (one co-tenant hiccup moves a sum) */
#define NOTIFY_BIN_SHIFT	10
#define NOTIFY_BINS	128

/* Thread accounting mode: which bucket the current on-CPU segment belongs to. */
enum mode {
	MODE_UNKNOWN = 0,	/* seen before its first syscall boundary */
	MODE_USER = 1,
	MODE_SYS = 2,
};

/* Syscall classes we time. */
enum sys_class {
	SC_OTHER = 0,
	SC_READ = 1,
	SC_WRITE = 2,
	SC_EPOLL = 3,
};

/* Probe self-counters (per-CPU array indices). */
enum counter {
	CNT_THREAD_MAP_FULL = 0,	/* a target thread could not be tracked */
	CNT_EXIT_UNMATCHED,		/* sys_exit without a recorded sys_enter */
	CNT_SKB_MAP_FULL,		/* an lo skb could not be timed */
	CNT_SKB_UNMATCHED,		/* lo receive without a recorded queue */
	CNT_WAKEUP_NOT_EPOLL,		/* target woken while not in epoll_wait */
	CNT_MAX,
};

struct op_stat {
	__u64 count;
	__u64 ns;	/* wall time from syscall entry to exit (or wakeup to exit) */
	__u64 bytes;	/* sum of positive return values (messages for *mmsg) */
	__u64 errors;	/* negative returns, e.g. -EAGAIN */
};

struct thread_stat {
	__u32 tgid;
	__u32 tid;
	char comm[TASK_COMM_LEN];
	struct op_stat read;
	struct op_stat write;
	struct op_stat epoll;	/* every epoll_wait/epoll_pwait/epoll_pwait2 call */
	struct op_stat notify;	/* sched_wakeup -> epoll_* return, only calls that slept */
	/* of notify: the watched proxy's (the first PID's) on-CPU time outside epoll_* on the
	 * woken thread's CPU between its wake-up and that return (it waited behind the proxy's
	 * reads, writes, user-space work and other syscalls, which are counted as the proxy's) */
	__u64 notify_behind_ns;
	/* socket-to-socket delivery inside a write-family call with no device on the way (a Unix
	 * socket, or TCP redirected by sockmap/sk_msg): sk_data_ready of the peer -> the end of
	 * that send (sock_send_length); loopback TCP is timed on lo instead */
	struct op_stat sock_ipc;
	struct op_stat errqueue;	/* recvmsg(MSG_ERRQUEUE): zero-copy completions, not in read */
	__u64 syscalls;		/* all syscalls that exited */
	__u64 sys_ns;		/* wall time in all syscalls */
	__u64 user_ns;		/* on-CPU outside syscalls */
	__u64 sys_cpu_ns;	/* on-CPU inside syscalls (incl. softirq run there) */
	__u64 unknown_cpu_ns;	/* on-CPU before the first syscall boundary was seen */
	__u64 switches_in;
	__u32 notify_hist_n[NOTIFY_BINS];
	__u64 notify_hist_ns[NOTIFY_BINS];
	/* tracking state, not an aggregate */
	__u64 seg_start;	/* start of the current on-CPU segment, 0 = off CPU */
	__u64 sys_start;
	__u64 wake_ts;
	__u64 wake_busy;	/* the proxy's busy time on wake_cpu at wake_ts */
	__u32 wake_cpu;
	__u32 pad_;
	__u64 sock_ready_ts;	/* first device-less sk_data_ready of the current send, 0 = none */
	__s64 sys_nr;
	__u32 mode;
	__u32 followed;		/* tracked because of its netns (-f), not its PID */
	__u32 errq;		/* the current call is recvmsg with MSG_ERRQUEUE */
	__u32 dev_tx;		/* the current call queued an skb on a device */
};

struct ipc_stat {
	__u64 count;
	__u64 ns;	/* net_dev_queue(lo) -> netif_receive_skb(lo), same skb */
	__u64 bytes;	/* skb->len at receive (IP packet, link header pulled) */
	__u64 max_ns;
};

#endif /* __SIDECAR_H */
