/* SPDX-License-Identifier: Apache-2.0 */
/* Shared between sockredir.bpf.c and its loader: the socket key and the self-counters. */
#ifndef __SOCKREDIR_H
#define __SOCKREDIR_H

#define MAX_SOCKS	65536

/* One end of a local TCP connection, as that end sees it (ports in host byte order), in
 * its network namespace: 127.0.0.1 of one pod is not 127.0.0.1 of another. */
struct sock_key {
	__u64 netns;	/* netns cookie */
	__u32 sip;	/* network byte order */
	__u32 dip;	/* network byte order */
	__u32 sport;
	__u32 dport;
};

enum counter {
	CNT_SOCKS_ADDED = 0,	/* established sockets put in the hash */
	CNT_ADD_FAILED,		/* ...that could not be (hash full, unsupported state) */
	CNT_MSG_REDIRECTED,	/* sendmsg calls delivered straight to the peer socket */
	CNT_MSG_PASSED,		/* sendmsg calls left to the TCP/IP stack (peer not in the hash) */
	CNT_MAX,
};

#endif /* __SOCKREDIR_H */
