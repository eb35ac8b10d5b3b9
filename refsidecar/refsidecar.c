// SPDX-License-Identifier: Apache-2.0
/*
 * refsidecar - a small reference L4 sidecar: epoll, Istio-style interception, and the two
 * kernel optimizations meshtax measures (Unix-socket IPC, zero-copy writes).
 *
 * Two listeners, as Istio lays them out: inbound (default 0.0.0.0:15006) forwards to the app,
 * outbound (default 0.0.0.0:15001) forwards to the remote service. After an iptables REDIRECT
 * the real destination comes from SO_ORIGINAL_DST; the proxy's own upstream connections are
 * left alone by the nat rules because the proxy runs as their exempted uid (1337 in Istio),
 * and inbound connects from 127.0.0.6 as Istio's passthrough does. A static destination
 * (--app, --upstream) serves loopback set-ups without iptables.
 *
 * --ipc uds: the app<->sidecar legs (the outbound listener and the connection to the app)
 * are Unix domain sockets instead of loopback TCP.
 * --write zerocopy: SO_ZEROCOPY on TCP sockets, MSG_ZEROCOPY sends of at least
 * --zerocopy-min bytes; completions are reaped from the socket error queue and a buffer is
 * not reused before the kernel has completed every send that referenced it.
 *
 * Prints "refsidecar: ready" to stderr once listening; on SIGINT/SIGTERM prints its counters
 * as one JSON line to stdout and exits; SIGUSR1 prints them and keeps running.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <linux/errqueue.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define FORMAT_VERSION 1
#define VERSION "0.1.0"	/* what `--version` prints; profiles record it */
#define CHUNK_SIZE (64 * 1024)
#define QUEUE_LIMIT (4 * CHUNK_SIZE)	/* per direction: stop reading above this */
#define MAX_WORKERS 64
#define MAX_EVENTS 64
#define PASSTHROUGH_SOURCE "127.0.0.6"

enum ipc { IPC_TCP, IPC_UDS };
enum kind { K_LISTENER, K_SOCK, K_WAKE };

struct addr {
	struct sockaddr_storage ss;
	socklen_t len;
	bool set;
};

static struct env {
	const char *inbound, *outbound, *app, *upstream;	/* as given */
	struct addr inbound_addr, outbound_addr, app_addr, upstream_addr;
	enum ipc ipc;
	bool zerocopy;
	size_t zerocopy_min;
	int workers;
} env = {
	.inbound = "0.0.0.0:15006",
	.zerocopy_min = 10240,
	.workers = 1,
};

struct stats {
	unsigned long long accepted, connect_failed, no_original_dst, bytes_in, bytes_out;
	unsigned long long sends, zc_sends, zc_fallbacks, zc_unsupported, zc_notifications;
	unsigned long long zc_completed, zc_copied, sessions_open, chunks_in_use, chunks_orphaned;
};

struct chunk {
	struct chunk *next;
	size_t off, len;
	int refs;		/* zero-copy sends not yet completed by the kernel */
	bool queued;		/* still (partly) unsent in a direction's queue */
	char data[CHUNK_SIZE];
};

struct zrec {			/* one zero-copy send awaiting its completion */
	uint32_t id;
	struct chunk *chunk;
};

struct worker;
struct session;

struct sock {
	enum kind kind;		/* first: epoll data points here */
	struct session *ss;
	int fd;
	uint32_t events;	/* registered epoll interest */
	bool connecting, zc;
	uint32_t zc_next;	/* id the kernel gives the next zero-copy send */
	struct zrec *zrecs;
	size_t nz, capz;
};

struct dir {			/* bytes read from sock[i] waiting to be written to sock[1 - i] */
	struct chunk *head, *tail;
	size_t queued;
	bool eof, shut;
};

struct session {
	struct worker *w;
	struct sock s[2];	/* 0: downstream (accepted), 1: upstream (connected) */
	struct dir d[2];
	bool closed;		/* freed after the current batch of events (others may name it) */
	struct session *prev, *next;
};

struct listener {
	enum kind kind;
	int fd, family;
	bool inbound;
	const struct addr *dest;	/* static destination, or NULL: the original one */
};

struct worker {
	pthread_t thread;
	int epfd;
	struct stats st;
	struct session *sessions, *closed;
	struct chunk *orphans;	/* chunks of closed sockets with sends never completed */
};

static struct listener listeners[2];
static int n_listeners;
static struct { enum kind kind; int fd; } wake = { K_WAKE, -1 };
static struct worker workers[MAX_WORKERS];
static atomic_bool exiting;

static const char usage[] =
"Usage: refsidecar [OPTIONS]\n"
"A reference L4 sidecar: two listeners (inbound, outbound), Istio-style interception.\n"
"  -i, --inbound ADDR       inbound listener (default 0.0.0.0:15006; 'none' disables it)\n"
"  -o, --outbound ADDR      outbound listener (default 0.0.0.0:15001; 'none' disables it)\n"
"  -a, --app ADDR           where inbound traffic goes (default: the original destination,\n"
"                           SO_ORIGINAL_DST, connected from " PASSTHROUGH_SOURCE ")\n"
"  -u, --upstream ADDR      where outbound traffic goes (default: the original destination)\n"
"      --ipc tcp|uds        app<->sidecar legs: loopback TCP (default) or Unix domain\n"
"                           sockets; with uds, --outbound and --app are socket paths\n"
"      --write copy|zerocopy  zerocopy: SO_ZEROCOPY + MSG_ZEROCOPY on TCP sockets\n"
"      --zerocopy-min BYTES sends smaller than this are copied (default 10240)\n"
"  -w, --workers N          worker threads, each with its own epoll (default 1)\n"
"  -h, --help               this text\n"
"      --version            print the version and exit\n"
"ADDR is IPV4:PORT, or a socket path where --ipc uds makes it one.\n"
"Prints 'refsidecar: ready' to stderr when listening. SIGINT/SIGTERM: counters as one JSON\n"
"line on stdout, then exit; SIGUSR1: counters, keep running.\n";

static int parse_addr(const char *text, bool path, struct addr *a)
{
	memset(a, 0, sizeof(*a));
	if (path) {
		struct sockaddr_un *un = (struct sockaddr_un *)&a->ss;

		if (!*text || strlen(text) >= sizeof(un->sun_path))
			return -1;
		un->sun_family = AF_UNIX;
		strcpy(un->sun_path, text);
		a->len = sizeof(*un);
	} else {
		struct sockaddr_in *in = (struct sockaddr_in *)&a->ss;
		const char *colon = strrchr(text, ':');
		char host[INET_ADDRSTRLEN];
		char *end;
		long port;

		if (!colon || (size_t)(colon - text) >= sizeof(host))
			return -1;
		memcpy(host, text, colon - text);
		host[colon - text] = '\0';
		port = strtol(colon + 1, &end, 10);
		if (*end || port < 1 || port > 65535 || inet_pton(AF_INET, host, &in->sin_addr) != 1)
			return -1;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		a->len = sizeof(*in);
	}
	a->set = true;
	return 0;
}

static int parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "inbound", required_argument, NULL, 'i' },
		{ "outbound", required_argument, NULL, 'o' },
		{ "app", required_argument, NULL, 'a' },
		{ "upstream", required_argument, NULL, 'u' },
		{ "ipc", required_argument, NULL, 'I' },
		{ "write", required_argument, NULL, 'W' },
		{ "zerocopy-min", required_argument, NULL, 'Z' },
		{ "workers", required_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{},
	};
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "i:o:a:u:w:h", opts, NULL)) != -1) {
		switch (c) {
		case 'i': env.inbound = optarg; break;
		case 'o': env.outbound = optarg; break;
		case 'a': env.app = optarg; break;
		case 'u': env.upstream = optarg; break;
		case 'I':
			if (!strcmp(optarg, "tcp"))
				env.ipc = IPC_TCP;
			else if (!strcmp(optarg, "uds"))
				env.ipc = IPC_UDS;
			else
				return fprintf(stderr, "--ipc: expected tcp or uds, got %s\n", optarg), -1;
			break;
		case 'W':
			if (strcmp(optarg, "copy") && strcmp(optarg, "zerocopy"))
				return fprintf(stderr, "--write: expected copy or zerocopy\n"), -1;
			env.zerocopy = !strcmp(optarg, "zerocopy");
			break;
		case 'Z':
			env.zerocopy_min = strtoul(optarg, &end, 10);
			if (*end || !*optarg)
				return fprintf(stderr, "--zerocopy-min: expected bytes\n"), -1;
			break;
		case 'w':
			env.workers = strtol(optarg, &end, 10);
			if (*end || env.workers < 1 || env.workers > MAX_WORKERS)
				return fprintf(stderr, "--workers: 1..%d\n", MAX_WORKERS), -1;
			break;
		case 'h': fputs(usage, stdout); exit(0);
		case 'V': printf("refsidecar %s\n", VERSION); exit(0);
		default: fputs(usage, stderr); return -1;
		}
	}
	if (optind < argc)
		return fprintf(stderr, "unexpected argument %s\n%s", argv[optind], usage), -1;
	bool uds = env.ipc == IPC_UDS;
	if (uds && (!env.app || !env.outbound))
		return fprintf(stderr, "--ipc uds needs --outbound PATH and --app PATH\n"), -1;
	if (!env.outbound)
		env.outbound = "0.0.0.0:15001";
	/* the app-facing legs are Unix sockets with --ipc uds; the others stay TCP */
	struct { const char *text, *name; bool path; struct addr *a; } all[] = {
		{ env.inbound, "--inbound", false, &env.inbound_addr },
		{ env.outbound, "--outbound", uds, &env.outbound_addr },
		{ env.app, "--app", uds, &env.app_addr },
		{ env.upstream, "--upstream", false, &env.upstream_addr },
	};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		if (!all[i].text || (i < 2 && !strcmp(all[i].text, "none")))
			continue;
		if (parse_addr(all[i].text, all[i].path, all[i].a))
			return fprintf(stderr, "%s: bad %s %s\n", all[i].name,
				       all[i].path ? "socket path" : "IPV4:PORT", all[i].text), -1;
	}
	if (!env.inbound_addr.set && !env.outbound_addr.set)
		return fprintf(stderr, "both listeners disabled: nothing to do\n"), -1;
	return 0;
}

/* ---- buffers ------------------------------------------------------------------------ */

static struct chunk *chunk_new(struct worker *w)
{
	struct chunk *c = malloc(sizeof(*c));

	if (c) {
		memset(c, 0, offsetof(struct chunk, data));
		w->st.chunks_in_use++;
	}
	return c;
}

static void chunk_put(struct worker *w, struct chunk *c)
{
	if (c->refs || c->queued)
		return;		/* the kernel or a queue still uses it */
	free(c);
	w->st.chunks_in_use--;
}

/* ---- sockets ------------------------------------------------------------------------ */

static void set_events(struct worker *w, struct sock *s, uint32_t ev)
{
	struct epoll_event e = { .events = ev, .data.ptr = s };

	if (ev != s->events && epoll_ctl(w->epfd, EPOLL_CTL_MOD, s->fd, &e) == 0)
		s->events = ev;
}

/* AF_UNIX has no zero-copy send: its sockets always copy */
static void enable_zerocopy(struct worker *w, struct sock *s, int family)
{
	int one = 1;

	if (!env.zerocopy)
		return;
	if (family == AF_INET && setsockopt(s->fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) == 0)
		s->zc = true;
	else
		w->st.zc_unsupported++;
}

/* Completions of zero-copy sends: each names a range of send ids [lo, hi]. */
static int reap_completions(struct worker *w, struct sock *s)
{
	char control[128];

	while (s->nz) {
		struct msghdr msg = { .msg_control = control, .msg_controllen = sizeof(control) };
		struct sock_extended_err *serr;
		struct cmsghdr *cm;

		if (recvmsg(s->fd, &msg, MSG_ERRQUEUE) < 0)
			return errno == EAGAIN ? 0 : -1;
		for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (!((cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) ||
			      (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR)))
				continue;
			serr = (struct sock_extended_err *)CMSG_DATA(cm);
			if (serr->ee_origin != SO_EE_ORIGIN_ZEROCOPY || serr->ee_errno)
				continue;
			uint32_t lo = serr->ee_info, hi = serr->ee_data;
			size_t keep = 0;

			w->st.zc_notifications++;
			if (serr->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
				w->st.zc_copied += hi - lo + 1;
			for (size_t i = 0; i < s->nz; i++) {
				struct zrec z = s->zrecs[i];

				if (z.id - lo <= hi - lo) {	/* in [lo, hi], modulo 2^32 */
					w->st.zc_completed++;
					z.chunk->refs--;
					chunk_put(w, z.chunk);
				} else {
					s->zrecs[keep++] = z;
				}
			}
			s->nz = keep;
		}
	}
	return 0;
}

static ssize_t send_chunk(struct worker *w, struct sock *s, struct chunk *c)
{
	size_t len = c->len - c->off;
	ssize_t n;

	if (s->zc && len >= env.zerocopy_min) {
		if (s->nz == s->capz) {
			size_t cap = s->capz ? 2 * s->capz : 16;
			struct zrec *z = realloc(s->zrecs, cap * sizeof(*z));

			if (!z)
				return -1;
			s->zrecs = z;
			s->capz = cap;
		}
		n = send(s->fd, c->data + c->off, len, MSG_NOSIGNAL | MSG_ZEROCOPY);
		if (n >= 0) {
			s->zrecs[s->nz++] = (struct zrec){ s->zc_next++, c };
			c->refs++;
			w->st.zc_sends++;
			return n;
		}
		if (errno != ENOBUFS)	/* ENOBUFS: over the optmem limit; copy instead */
			return -1;
		w->st.zc_fallbacks++;
	}
	n = send(s->fd, c->data + c->off, len, MSG_NOSIGNAL);
	if (n >= 0)
		w->st.sends++;
	return n;
}

/* ---- sessions ----------------------------------------------------------------------- */

static void session_close(struct session *ss)
{
	struct worker *w = ss->w;

	/* first out of the queues: a chunk the kernel still reads is then only in a zrec */
	for (int i = 0; i < 2; i++) {
		struct chunk *c, *next;

		for (c = ss->d[i].head; c; c = next) {
			next = c->next;
			c->next = NULL;
			c->queued = false;
			chunk_put(w, c);
		}
	}
	for (int i = 0; i < 2; i++) {
		struct sock *s = &ss->s[i];

		if (s->fd >= 0) {
			reap_completions(w, s);
			close(s->fd);
		}
		/* sends never completed: the pages may still be in flight, never reuse them */
		for (size_t k = 0; k < s->nz; k++) {
			struct chunk *o = s->zrecs[k].chunk;

			if (--o->refs == 0) {
				o->next = w->orphans;
				w->orphans = o;
				w->st.chunks_orphaned++;
			}
		}
		free(s->zrecs);
	}
	if (ss->prev)
		ss->prev->next = ss->next;
	else
		w->sessions = ss->next;
	if (ss->next)
		ss->next->prev = ss->prev;
	w->st.sessions_open--;
	ss->closed = true;
	ss->next = w->closed;
	w->closed = ss;
}

static void free_closed(struct worker *w)
{
	while (w->closed) {
		struct session *ss = w->closed;

		w->closed = ss->next;
		free(ss);
	}
}

/* read from s[i] into d[i]; -1 on a socket error */
static int pump_in(struct worker *w, struct session *ss, int i)
{
	struct dir *d = &ss->d[i];

	while (!d->eof && d->queued < QUEUE_LIMIT) {
		struct chunk *c = d->tail;
		ssize_t n;

		if (!c || c->len == CHUNK_SIZE || c->refs) {
			if (!(c = chunk_new(w)))
				return -1;
			c->queued = true;
			if (d->tail)
				d->tail->next = c;
			else
				d->head = c;
			d->tail = c;
		}
		n = recv(ss->s[i].fd, c->data + c->len, CHUNK_SIZE - c->len, 0);
		if (n == 0) {
			d->eof = true;
		} else if (n < 0) {
			return errno == EAGAIN ? 0 : -1;
		} else {
			c->len += n;
			d->queued += n;
			w->st.bytes_in += n;
		}
	}
	return 0;
}

/* write d[i] to s[1 - i]; -1 on a socket error */
static int pump_out(struct worker *w, struct session *ss, int i)
{
	struct dir *d = &ss->d[i];
	struct sock *dst = &ss->s[1 - i];

	if (dst->connecting)
		return 0;
	while (d->head) {
		struct chunk *c = d->head;
		ssize_t n;

		if (c->off == c->len) {	/* an empty tail after EOF, or all sent */
			if (c == d->tail && !d->eof && c->len < CHUNK_SIZE && !c->refs)
				break;	/* more may be read into it */
			d->head = c->next;
			if (!d->head)
				d->tail = NULL;
			c->queued = false;
			chunk_put(w, c);
			continue;
		}
		n = send_chunk(w, dst, c);
		if (n < 0)
			return errno == EAGAIN ? 0 : -1;
		c->off += n;
		d->queued -= n;
		w->st.bytes_out += n;
	}
	if (!d->head && d->eof && !d->shut) {
		shutdown(dst->fd, SHUT_WR);
		d->shut = true;
	}
	return 0;
}

static void session_update(struct session *ss)
{
	for (int i = 0; i < 2; i++) {
		struct sock *s = &ss->s[i];
		uint32_t ev = 0;

		if (!ss->d[i].eof && ss->d[i].queued < QUEUE_LIMIT && !s->connecting)
			ev |= EPOLLIN;
		if (s->connecting || ss->d[1 - i].queued)
			ev |= EPOLLOUT;
		set_events(ss->w, s, ev);
	}
}

static bool session_done(const struct session *ss)
{
	return ss->d[0].shut && ss->d[1].shut && !ss->s[0].nz && !ss->s[1].nz;
}

static void on_sock(struct worker *w, struct sock *s, uint32_t ev)
{
	struct session *ss = s->ss;
	int err = 0;
	socklen_t len = sizeof(err);

	if (ss->closed)
		return;
	if (s->connecting && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
			w->st.connect_failed++;
			goto close;
		}
		s->connecting = false;
	}
	if (ev & EPOLLERR) {
		/* completions wake EPOLLERR too; anything else in SO_ERROR ends the session */
		if (reap_completions(w, s) || getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) ||
		    err)
			goto close;
	}
	for (int i = 0; i < 2; i++)
		if ((!ss->s[i].connecting && pump_in(w, ss, i)) || pump_out(w, ss, i))
			goto close;
	/* a finished session waiting for completions may see EPOLLHUP until they arrive */
	if (!session_done(ss)) {
		session_update(ss);
		return;
	}
close:
	session_close(ss);
}

static int add_sock(struct worker *w, struct sock *s, uint32_t ev)
{
	struct epoll_event e = { .events = ev, .data.ptr = s };

	s->events = ev;
	return epoll_ctl(w->epfd, EPOLL_CTL_ADD, s->fd, &e);
}

/* The original destination of a redirected connection; -1 when it was not redirected. */
static int original_dst(int fd, struct addr *a)
{
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);

	struct sockaddr_in *me = (struct sockaddr_in *)&local, *orig = (struct sockaddr_in *)&a->ss;

	a->len = sizeof(struct sockaddr_in);
	if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &a->ss, &a->len) ||
	    getsockname(fd, (struct sockaddr *)&local, &llen) || orig->sin_family != AF_INET)
		return -1;
	/* not redirected: the "original" destination is this listener, a loop */
	if (me->sin_addr.s_addr == orig->sin_addr.s_addr && me->sin_port == orig->sin_port)
		return -1;
	return 0;
}

static int connect_upstream(const struct listener *l, int down, struct addr *dst)
{
	struct sockaddr_in src = { .sin_family = AF_INET };
	int fd, one = 1;

	if (l->dest) {
		*dst = *l->dest;
	} else if (original_dst(down, dst)) {
		return -2;
	}
	fd = socket(dst->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (dst->ss.ss_family == AF_INET) {
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		/* Istio's inbound passthrough source: the nat rules let it reach the app */
		if (l->inbound && !l->dest) {
			inet_pton(AF_INET, PASSTHROUGH_SOURCE, &src.sin_addr);
			if (bind(fd, (struct sockaddr *)&src, sizeof(src)))
				return close(fd), -1;
		}
	}
	if (connect(fd, (struct sockaddr *)&dst->ss, dst->len) && errno != EINPROGRESS)
		return close(fd), -1;
	return fd;
}

static void on_accept(struct worker *w, struct listener *l)
{
	for (;;) {
		struct session *ss;
		struct addr dst;
		int one = 1, up, down;

		down = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (down < 0)
			return;	/* EAGAIN, or another worker took it */
		w->st.accepted++;
		up = connect_upstream(l, down, &dst);
		if (up < 0) {
			if (up == -2)
				w->st.no_original_dst++;
			else
				w->st.connect_failed++;
			close(down);
			continue;
		}
		setsockopt(down, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		ss = calloc(1, sizeof(*ss));
		if (!ss) {
			close(down);
			close(up);
			continue;
		}
		ss->w = w;
		for (int i = 0; i < 2; i++) {
			ss->s[i] = (struct sock){ .kind = K_SOCK, .ss = ss,
						  .fd = i ? up : down };
			enable_zerocopy(w, &ss->s[i], i ? dst.ss.ss_family : l->family);
		}
		ss->s[1].connecting = true;
		ss->next = w->sessions;
		if (w->sessions)
			w->sessions->prev = ss;
		w->sessions = ss;
		w->st.sessions_open++;
		if (add_sock(w, &ss->s[0], 0) || add_sock(w, &ss->s[1], EPOLLOUT)) {
			session_close(ss);	/* freed after this batch */
			continue;
		}
		session_update(ss);
	}
}

static void *worker_run(void *arg)
{
	struct worker *w = arg;
	struct epoll_event events[MAX_EVENTS];

	while (!atomic_load(&exiting)) {
		int n = epoll_wait(w->epfd, events, MAX_EVENTS, -1);

		for (int i = 0; i < n; i++) {
			enum kind *k = events[i].data.ptr;

			if (*k == K_LISTENER)
				on_accept(w, (struct listener *)k);
			else if (*k == K_SOCK)
				on_sock(w, (struct sock *)k, events[i].events);
		}
		free_closed(w);
	}
	return NULL;
}

static int listen_on(const struct addr *a, bool inbound, const struct addr *dest)
{
	struct listener *l = &listeners[n_listeners];
	int one = 1;

	l->kind = K_LISTENER;
	l->family = a->ss.ss_family;
	l->inbound = inbound;
	l->dest = dest->set ? dest : NULL;
	l->fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0)
		return -1;
	n_listeners++;
	if (a->ss.ss_family == AF_UNIX)
		unlink(((struct sockaddr_un *)&a->ss)->sun_path);	/* a stale socket */
	else
		setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l->fd, (const struct sockaddr *)&a->ss, a->len))
		return -1;
	/* an app of any uid may connect to the proxy's socket, as it may to its port */
	if (a->ss.ss_family == AF_UNIX && chmod(((struct sockaddr_un *)&a->ss)->sun_path, 0666))
		return -1;
	return listen(l->fd, 1024);
}

static void print_stats(void)
{
	struct stats t = { 0 };

	/* other workers' counters are read while they run: a racy but harmless snapshot */
	for (int i = 0; i < env.workers; i++) {
		unsigned long long *dst = (unsigned long long *)&t;
		const unsigned long long *src = (const unsigned long long *)&workers[i].st;

		for (size_t k = 0; k < sizeof(t) / sizeof(*dst); k++)
			dst[k] += src[k];
	}
	printf("{\"format\": %d, \"ipc\": \"%s\", \"write\": \"%s\", \"zerocopy_min\": %zu, "
	       "\"workers\": %d, \"accepted\": %llu, \"connect_failed\": %llu, "
	       "\"no_original_dst\": %llu, \"bytes_in\": %llu, \"bytes_out\": %llu, "
	       "\"sends\": %llu, \"zc_sends\": %llu, \"zc_fallbacks\": %llu, "
	       "\"zc_unsupported\": %llu, \"zc_notifications\": %llu, \"zc_completed\": %llu, "
	       "\"zc_copied\": %llu, \"sessions_open\": %llu, \"chunks_in_use\": %llu, "
	       "\"chunks_orphaned\": %llu}\n",
	       FORMAT_VERSION, env.ipc == IPC_UDS ? "uds" : "tcp",
	       env.zerocopy ? "zerocopy" : "copy", env.zerocopy_min, env.workers, t.accepted,
	       t.connect_failed, t.no_original_dst, t.bytes_in, t.bytes_out, t.sends, t.zc_sends,
	       t.zc_fallbacks, t.zc_unsupported, t.zc_notifications, t.zc_completed, t.zc_copied,
	       t.sessions_open, t.chunks_in_use, t.chunks_orphaned);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct epoll_event e;
	sigset_t sigs;
	int started = 0, err = 1, sig;

	if (parse_args(argc, argv))
		return 2;
	/* every thread blocks the signals; main waits for them */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	for (int i = 0; i < env.workers; i++)
		workers[i].epfd = -1;
	if ((env.inbound_addr.set && listen_on(&env.inbound_addr, true, &env.app_addr)) ||
	    (env.outbound_addr.set && listen_on(&env.outbound_addr, false, &env.upstream_addr))) {
		perror("refsidecar: listen");
		goto cleanup;
	}
	wake.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (wake.fd < 0) {
		perror("refsidecar: eventfd");
		goto cleanup;
	}
	for (int i = 0; i < env.workers; i++) {
		struct worker *w = &workers[i];

		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		if (w->epfd < 0)
			goto fail_setup;
		/* EPOLLEXCLUSIVE: one worker wakes per new connection, not all */
		for (int l = 0; l < n_listeners; l++) {
			e = (struct epoll_event){ .events = EPOLLIN | EPOLLEXCLUSIVE,
						  .data.ptr = &listeners[l] };
			if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, listeners[l].fd, &e))
				goto fail_setup;
		}
		e = (struct epoll_event){ .events = EPOLLIN, .data.ptr = &wake };
		if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, wake.fd, &e))
			goto fail_setup;
	}
	for (; started < env.workers; started++)
		if (pthread_create(&workers[started].thread, NULL, worker_run, &workers[started]))
			goto fail_setup;
	fprintf(stderr, "refsidecar: ready\n");
	for (;;) {
		if (sigwait(&sigs, &sig))
			continue;
		if (sig != SIGUSR1)
			break;
		print_stats();
	}
	err = 0;
	goto cleanup;
fail_setup:
	perror("refsidecar: setup");
cleanup:
	atomic_store(&exiting, true);
	if (wake.fd >= 0 && eventfd_write(wake.fd, 1))
		perror("refsidecar: wake");
	for (int i = 0; i < started; i++)
		pthread_join(workers[i].thread, NULL);
	for (int i = 0; i < env.workers; i++) {
		struct worker *w = &workers[i];

		while (w->sessions)
			session_close(w->sessions);
		free_closed(w);
		while (w->orphans) {
			struct chunk *c = w->orphans;

			w->orphans = c->next;
			free(c);
			w->st.chunks_in_use--;
		}
		if (w->epfd >= 0)
			close(w->epfd);
	}
	if (!err || started)
		print_stats();
	for (int l = 0; l < n_listeners; l++) {
		close(listeners[l].fd);
		if (listeners[l].family == AF_UNIX)
			unlink(((struct sockaddr_un *)&env.outbound_addr.ss)->sun_path);
	}
	if (wake.fd >= 0)
		close(wake.fd);
	return err;
}
