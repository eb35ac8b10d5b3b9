// SPDX-License-Identifier: Apache-2.0
/*
 * sidecar: per-thread cost components of a proxy process (the "sidecar").
 *
 * For the target thread groups (rodata, set by the loader) it aggregates, per thread:
 *   Read / Write    sys_enter->sys_exit (raw tracepoints) of the read/write families, bytes;
 *   Notification    sched_wakeup of a thread sleeping in epoll_* -> return of that epoll_*;
 *                   and of it, the watched proxy's (the first PID's) on-CPU time outside
 *                   epoll_* on the woken thread's CPU in between (notify_behind_ns);
 *   on-CPU split    sched_switch in/out and syscall boundaries split on-CPU time into
 *                   user (between syscalls) and sys (inside syscalls).
 * Optionally also for every task of one more network namespace (the client pod), found on
 * its first syscall and marked "followed".
 * and, for loopback in the target's network namespace (not per thread):
 *   IPC             net_dev_queue(lo) -> netif_receive_skb(lo) of the same skb;
 * and, per thread, for deliveries with no device on the way (a Unix socket, or TCP redirected
 * by sockmap/sk_msg: the sender queues the data on the peer and wakes it inside its own send):
 *   socket IPC      sk_data_ready of an AF_UNIX socket, or of an AF_INET one in a send that
 *                   queued nothing on a device, inside a write-family call -> sock_send_length
 *                   of that send; recvmsg(MSG_ERRQUEUE) (zero-copy completions) is counted
 *                   apart from Read.
 * Everything is summed in maps; nothing is streamed, so nothing can be lost in a buffer.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "sidecar.h"

#if !defined(__TARGET_ARCH_x86)
#error "syscall numbers below are x86_64 only"
#endif

/* x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl) */
#define NR_read		0
#define NR_write	1
#define NR_readv	19
#define NR_writev	20
#define NR_sendto	44
#define NR_recvfrom	45
#define NR_sendmsg	46
#define NR_recvmsg	47
#define NR_epoll_wait	232
#define NR_epoll_pwait	281
#define NR_recvmmsg	299
#define NR_sendmmsg	307
#define NR_epoll_pwait2	441

#define LOOPBACK_IFINDEX 1
#define AF_UNIX		1
#define AF_INET		2
#define MSG_ERRQUEUE	0x2000

const volatile __u32 targ_tgid[MAX_TGIDS] = {};
const volatile __u32 n_tgids = 0;
const volatile __u32 targ_netns = 0;	/* netns inode for IPC; 0 = any netns */
/* also follow every task of this netns (inode; 0 = none): the load generator's pod, whose
 * processes start after the probe (one per window), so they cannot be named by PID */
const volatile __u32 follow_netns = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);	/* tid */
	__type(value, struct thread_stat);
} threads SEC(".maps");

struct {
	/* LRU: an skb dropped between queue and receive must not pin an entry forever */
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_INFLIGHT_SKBS);
	__type(key, __u64);	/* skb address */
	__type(value, __u64);	/* queue timestamp */
} skb_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ipc_stat);
} ipc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Per CPU id (a plain array: a wake-up reads the woken thread's CPU from another CPU):
 * on-CPU time of the watched proxy's threads (targ_tgid[0]) outside epoll_* calls, added
 * when each of their segments closes on that CPU. A thread woken on that CPU waits behind
 * this work, which the proxy's Read, Write and Other already count. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);
	__type(value, __u64);
} proxy_busy SEC(".maps");

static const struct thread_stat zero_stat;

static __always_inline void bump(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);

	if (v)
		*v += 1;
}

static __always_inline bool is_target(__u32 tgid)
{
	for (int i = 0; i < MAX_TGIDS; i++) {
		if (i >= n_tgids)
			break;
		if (targ_tgid[i] == tgid)
			return true;
	}
	return false;
}

static __always_inline bool in_follow_netns(void)
{
	struct task_struct *task;

	if (!follow_netns)
		return false;
	task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, nsproxy, net_ns, ns.inum) == follow_netns;
}

/* Current task's entry, created on first sight; NULL if not a target or the map is full. */
static __always_inline struct thread_stat *current_stat(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct thread_stat *st;

	st = bpf_map_lookup_elem(&threads, &tid);
	if (st)
		return st;
	if (!is_target(tgid) && !in_follow_netns())
		return NULL;
	/* EEXIST (a racing insert) is fine; a full map shows up as a failed lookup */
	bpf_map_update_elem(&threads, &tid, &zero_stat, BPF_NOEXIST);
	st = bpf_map_lookup_elem(&threads, &tid);
	if (!st) {
		bump(CNT_THREAD_MAP_FULL);
		return NULL;
	}
	st->tgid = tgid;
	st->tid = tid;
	st->followed = !is_target(tgid);
	bpf_get_current_comm(&st->comm, sizeof(st->comm));
	return st;
}

static __always_inline int classify(__s64 nr)
{
	switch (nr) {
	case NR_read: case NR_readv: case NR_recvfrom: case NR_recvmsg: case NR_recvmmsg:
		return SC_READ;
	case NR_write: case NR_writev: case NR_sendto: case NR_sendmsg: case NR_sendmmsg:
		return SC_WRITE;
	case NR_epoll_wait: case NR_epoll_pwait: case NR_epoll_pwait2:
		return SC_EPOLL;
	}
	return SC_OTHER;
}

/* Is `st` (the current task) a thread of the watched proxy doing work its components count:
 * user space, or a syscall other than epoll_* (whose wake-up wait is Notification)? */
static __always_inline bool proxy_counted(const struct thread_stat *st)
{
	if (st->followed || !n_tgids || st->tgid != targ_tgid[0])
		return false;
	return st->mode == MODE_USER ||
	       (st->mode == MODE_SYS && st->sys_start && classify(st->sys_nr) != SC_EPOLL);
}

static __always_inline __u64 *busy_of(__u32 cpu)
{
	return bpf_map_lookup_elem(&proxy_busy, &cpu);
}

/* Close the current on-CPU segment at `now` into the bucket of the current mode (`st` is the
 * current task's, so the segment ran on this CPU). */
static __always_inline void close_segment(struct thread_stat *st, __u64 now)
{
	__u64 delta, *busy;

	if (!st->seg_start)
		return;
	delta = now - st->seg_start;
	if (st->mode == MODE_USER)
		st->user_ns += delta;
	else if (st->mode == MODE_SYS)
		st->sys_cpu_ns += delta;
	else
		st->unknown_cpu_ns += delta;
	if (proxy_counted(st)) {
		busy = busy_of(bpf_get_smp_processor_id());
		if (busy)
			*busy += delta;
	}
	st->seg_start = now;
}


static __always_inline void add_op(struct op_stat *op, __u64 ns, __s64 ret)
{
	op->count++;
	op->ns += ns;
	if (ret > 0)
		op->bytes += ret;
	else if (ret < 0)
		op->errors++;
}

/* raw tracepoints: no perf record is built per event, which halves the per-syscall cost */
SEC("raw_tracepoint/sys_enter")
int sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__s64 id = ctx->args[1];
	struct thread_stat *st = current_stat();
	__u64 now;

	if (!st)
		return 0;
	now = bpf_ktime_get_ns();
	if (!st->seg_start)
		st->seg_start = now;	/* running, but its switch-in was before we attached */
	close_segment(st, now);
	st->mode = MODE_SYS;
	st->sys_start = now;
	st->sys_nr = id;
	st->wake_ts = 0;
	st->sock_ready_ts = 0;
	st->errq = 0;
	st->dev_tx = 0;
	if (id == NR_recvmsg) {
		struct pt_regs *regs = (struct pt_regs *)ctx->args[0];

		st->errq = (BPF_CORE_READ(regs, dx) & MSG_ERRQUEUE) != 0;
	}
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	__s64 id;
	struct thread_stat *st = current_stat();
	__u64 now, dur;
	__s64 ret;

	if (!st)
		return 0;
	now = bpf_ktime_get_ns();
	if (!st->seg_start)
		st->seg_start = now;
	close_segment(st, now);
	st->mode = MODE_USER;
	id = BPF_CORE_READ(regs, orig_ax);
	if (!st->sys_start || st->sys_nr != id) {
		bump(CNT_EXIT_UNMATCHED);
		goto out;
	}
	dur = now - st->sys_start;
	ret = ctx->args[1];
	st->syscalls++;
	st->sys_ns += dur;
	switch (classify(id)) {
	case SC_READ:
		add_op(st->errq ? &st->errqueue : &st->read, dur, ret);
		break;
	case SC_WRITE:
		add_op(&st->write, dur, ret);
		break;
	case SC_EPOLL:
		add_op(&st->epoll, dur, ret);
		if (st->wake_ts && st->wake_ts <= now) {
			__u64 lat = now - st->wake_ts;
			__u64 bin = lat >> NOTIFY_BIN_SHIFT;
			__u32 cpu = bpf_get_smp_processor_id();
			__u64 *busy = busy_of(cpu);

			add_op(&st->notify, lat, ret);
			/* woken and returning on one CPU: the proxy's counted work in between */
			if (busy && cpu == st->wake_cpu && *busy > st->wake_busy) {
				__u64 behind = *busy - st->wake_busy;

				st->notify_behind_ns += behind < lat ? behind : lat;
			}
			if (bin >= NOTIFY_BINS)
				bin = NOTIFY_BINS - 1;
			st->notify_hist_n[bin]++;
			st->notify_hist_ns[bin] += lat;
		}
		break;
	}
out:
	st->sys_start = 0;
	st->wake_ts = 0;
	st->sock_ready_ts = 0;
	st->errq = 0;
	return 0;
}

/* raw tracepoints for the scheduler too: their recursion guard is per program, so a wakeup
 * from an interrupt that lands while another of our programs runs is not skipped */
SEC("raw_tracepoint/sched_switch")
int sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *next_task = (struct task_struct *)ctx->args[2];
	__u32 next = BPF_CORE_READ(next_task, pid);
	struct thread_stat *st;
	__u64 now = 0;

	/* prev is current: its tgid is known without a lookup */
	st = current_stat();
	if (st) {
		now = bpf_ktime_get_ns();
		close_segment(st, now);
		st->seg_start = 0;
	}
	/* next: only threads already known (seeded from /proc or seen in a syscall) */
	if (!next)
		return 0;
	st = bpf_map_lookup_elem(&threads, &next);
	if (st) {
		st->seg_start = now ? now : bpf_ktime_get_ns();
		st->switches_in++;
	}
	return 0;
}

SEC("raw_tracepoint/sched_wakeup")
int sched_wakeup(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *p = (struct task_struct *)ctx->args[0];
	__u32 tid = BPF_CORE_READ(p, pid);
	struct thread_stat *st = bpf_map_lookup_elem(&threads, &tid);

	if (!st)
		return 0;
	if (st->mode != MODE_SYS || !st->sys_start || classify(st->sys_nr) != SC_EPOLL) {
		bump(CNT_WAKEUP_NOT_EPOLL);
		return 0;
	}
	/* the first wakeup since the call began is the one that ends the sleep */
	if (!st->wake_ts) {
		__u64 now = bpf_ktime_get_ns(), *busy;
		__u32 cpu = BPF_CORE_READ(p, thread_info.cpu);
		struct thread_stat *cur;

		st->wake_ts = now;
		st->wake_cpu = cpu;
		busy = busy_of(cpu);
		st->wake_busy = busy ? *busy : 0;
		/* woken by the proxy on that very CPU: the part of its current segment before
		 * the wake-up is not behind it (a waker on another CPU is not the proxy running
		 * there: its segment in progress, if any, is not known here) */
		if (busy && cpu == bpf_get_smp_processor_id()) {
			__u32 cur_tid = (__u32)bpf_get_current_pid_tgid();

			/* look up only: this may run in an interrupt on any task */
			cur = bpf_map_lookup_elem(&threads, &cur_tid);
			if (cur && cur != st && cur->seg_start && cur->seg_start <= now &&
			    proxy_counted(cur))
				st->wake_busy += now - cur->seg_start;
		}
	}
	return 0;
}

static __always_inline __u16 sk_family(const struct sock *sk)
{
	return BPF_CORE_READ(sk, __sk_common.skc_family);
}

/* The peer socket was given data and woken inside a tracked thread's send, with no device on
 * the way: a Unix socket, or (no skb queued on a device in this send) TCP redirected by
 * sk_msg. On loopback TCP the peer's wake-up also runs inside the send, after lo: timed there.
 * Raw tracepoints, looked up by tid only: no entry is made from whatever context this runs in. */
SEC("raw_tracepoint/sk_data_ready")
int sk_data_ready(struct bpf_raw_tracepoint_args *ctx)
{
	const struct sock *sk = (const struct sock *)ctx->args[0];
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stat *st = bpf_map_lookup_elem(&threads, &tid);

	if (!st || st->mode != MODE_SYS || !st->sys_start || classify(st->sys_nr) != SC_WRITE)
		return 0;
	/* the first delivery of the send: a message split over several skbs counts from there */
	if (!st->sock_ready_ts && (sk_family(sk) == AF_UNIX ||
				   (sk_family(sk) == AF_INET && !st->dev_tx)))
		st->sock_ready_ts = bpf_ktime_get_ns();
	return 0;
}

SEC("raw_tracepoint/sock_send_length")
int sock_send_length(struct bpf_raw_tracepoint_args *ctx)
{
	__s64 ret = (int)ctx->args[1];
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct thread_stat *st = bpf_map_lookup_elem(&threads, &tid);
	__u64 now;

	if (!st || !st->sock_ready_ts)
		return 0;
	now = bpf_ktime_get_ns();
	if (now >= st->sock_ready_ts)
		add_op(&st->sock_ipc, now - st->sock_ready_ts, ret);
	st->sock_ready_ts = 0;
	return 0;
}

static __always_inline bool is_target_lo(struct sk_buff *skb)
{
	struct net_device *dev = BPF_CORE_READ(skb, dev);

	if (!dev || BPF_CORE_READ(dev, ifindex) != LOOPBACK_IFINDEX)
		return false;
	return !targ_netns || BPF_CORE_READ(dev, nd_net.net, ns.inum) == targ_netns;
}

SEC("tracepoint/net/net_dev_queue")
int net_dev_queue(struct trace_event_raw_net_dev_template *ctx)
{
	__u64 skb = (__u64)ctx->skbaddr;
	__u64 now;

	{
		/* a send that goes through a device is not a socket-to-socket delivery */
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		struct thread_stat *st = bpf_map_lookup_elem(&threads, &tid);

		if (st && st->mode == MODE_SYS)
			st->dev_tx = 1;
	}
	if (!is_target_lo((struct sk_buff *)skb))
		return 0;
	now = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&skb_start, &skb, &now, BPF_ANY))
		bump(CNT_SKB_MAP_FULL);
	return 0;
}

SEC("tracepoint/net/netif_receive_skb")
int netif_receive_skb(struct trace_event_raw_net_dev_template *ctx)
{
	__u64 skb = (__u64)ctx->skbaddr;
	__u64 *start, dur;
	__u32 zero = 0;
	struct ipc_stat *s;

	start = bpf_map_lookup_elem(&skb_start, &skb);
	if (!start)
		return 0;
	dur = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&skb_start, &skb);
	/* a stale entry whose address was reused for a non-lo skb */
	if (!is_target_lo((struct sk_buff *)skb)) {
		bump(CNT_SKB_UNMATCHED);
		return 0;
	}
	s = bpf_map_lookup_elem(&ipc, &zero);
	if (!s)
		return 0;
	s->count++;
	s->ns += dur;
	s->bytes += ctx->len;
	if (dur > s->max_ns)
		s->max_ns = dur;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
