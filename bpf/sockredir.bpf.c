// SPDX-License-Identifier: Apache-2.0
/*
 * sockredir: socket-level redirection between local TCP sockets, as Merbridge and Cilium do.
 *
 * A sockops program (attached to a cgroup) puts every established IPv4 TCP socket of that
 * cgroup in a sockhash, keyed by its 4-tuple. An sk_msg program (attached to the sockhash)
 * looks up the peer of each sendmsg (same network namespace, reversed 4-tuple) and, when the
 * peer is in the hash too, puts the data
 * straight on the peer's receive queue: no skb, no loopback device, no TCP/IP stack.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sockredir.h"

#define AF_INET 2

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, MAX_SOCKS);
	__type(key, struct sock_key);
	__type(value, __u64);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &c);

	if (v)
		(*v)++;
}

SEC("sockops")
int sockredir_sockops(struct bpf_sock_ops *skops)
{
	struct sock_key key = {};

	if (skops->family != AF_INET)
		return 0;
	if (skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB &&
	    skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB)
		return 0;
	key.netns = bpf_get_netns_cookie(skops);
	key.sip = skops->local_ip4;
	key.dip = skops->remote_ip4;
	key.sport = skops->local_port;			/* host byte order */
	key.dport = bpf_ntohl(skops->remote_port);	/* network order, upper half */
	count(bpf_sock_hash_update(skops, &socks, &key, BPF_NOEXIST) ? CNT_ADD_FAILED
								       : CNT_SOCKS_ADDED);
	return 0;
}

SEC("sk_msg")
int sockredir_msg(struct sk_msg_md *msg)
{
	/* the peer's key: its source is our destination */
	struct sock_key peer = {
		.netns = bpf_get_netns_cookie(msg),
		.sip = msg->remote_ip4,
		.dip = msg->local_ip4,
		.sport = bpf_ntohl(msg->remote_port),
		.dport = msg->local_port,
	};

	/* not found: SK_DROP from the helper, but the message must still go out the normal way */
	if (bpf_msg_redirect_hash(msg, &socks, &peer, BPF_F_INGRESS) == SK_PASS)
		count(CNT_MSG_REDIRECTED);
	else
		count(CNT_MSG_PASSED);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
