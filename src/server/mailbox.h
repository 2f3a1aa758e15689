/*
 * mailbox.h - how one serving thread runs a call on another (threads.c's
 * control plane on the instances past the first): the caller posts a
 * function and its argument and waits; the owner runs it between two turns
 * of its loop (one atomic load a turn when nothing is asked) and wakes the
 * caller.  A call on an instance whose thread is not running (before
 * start, after stop), or on the first instance (the caller's own thread),
 * runs in place.  A failure's message (rps__errbuf) comes back with it.
 */
#ifndef RPS_SERVER_MAILBOX_H
#define RPS_SERVER_MAILBOX_H

#include <pthread.h>
#include <stdbool.h>

struct rps__server;

typedef void (*rps__srv_mbox_fn)(struct rps__server *srv, void *arg);

struct srv_mbox {
	pthread_mutex_t lock;
	pthread_cond_t done;
	rps__srv_mbox_fn fn;
	void *arg;
	bool pending;		/* atomic: the loop looks at it every turn */
	bool running;		/* (under lock) its thread runs: calls are posted, not run in place */
	bool owned;		/* (under lock) owner is set */
	pthread_t owner;	/* the thread that serves it */
	int fd;			/* eventfd: wakes the loop from poll() (-1: no mailbox) */
	char err[512];		/* fn's failure message, for the caller's thread */
};

int rps__srv_mbox_init(struct rps__server *srv);
void rps__srv_mbox_fini(struct rps__server *srv);
/* The owner's thread, first thing: it serves the mailbox from now. */
void rps__srv_mbox_claim(struct rps__server *srv);
/* Its thread is about to start: calls are posted from now. */
void rps__srv_mbox_open(struct rps__server *srv);
/* Its thread stops (or did not start): calls run in place from now; one
 * asked meanwhile runs now. */
void rps__srv_mbox_close(struct rps__server *srv);
/* Run what another thread asked (the loop, via rps__srv_mbox_poll). */
void rps__srv_mbox_serve(struct rps__server *srv);
/* Run fn on inst's thread and wait for it (in place, see above). */
void rps__srv_mbox_call(struct rps__server *inst, rps__srv_mbox_fn fn, void *arg);

#endif
