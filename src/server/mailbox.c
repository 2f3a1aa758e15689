/*
 * mailbox.c - the mailbox of a serving thread (mailbox.h): a call one
 * thread asks of another, run between two turns of the owner's loop while
 * the caller waits.  threads.c calls its instances through it; the loop
 * (server.c) serves it.
 */
#include "config.h"
#include "common/common.h"
#include "server/mailbox.h"
#include "server/server_int.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

int rps__srv_mbox_init(struct rps__server *srv)
{
	srv->thr.mbox.fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->thr.mbox.fd < 0)
		return rps__seterr(-errno, "eventfd: %s", strerror(errno));
	pthread_mutex_init(&srv->thr.mbox.lock, NULL);
	pthread_cond_init(&srv->thr.mbox.done, NULL);
	return 0;
}

void rps__srv_mbox_fini(struct rps__server *srv)
{
	if (srv->thr.mbox.fd < 0)
		return;
	close(srv->thr.mbox.fd);
	srv->thr.mbox.fd = -1;
	pthread_cond_destroy(&srv->thr.mbox.done);
	pthread_mutex_destroy(&srv->thr.mbox.lock);
}

void rps__srv_mbox_claim(struct rps__server *srv)
{
	pthread_mutex_lock(&srv->thr.mbox.lock);
	srv->thr.mbox.owner = pthread_self();
	srv->thr.mbox.owned = true;
	pthread_mutex_unlock(&srv->thr.mbox.lock);
}

void rps__srv_mbox_open(struct rps__server *srv)
{
	pthread_mutex_lock(&srv->thr.mbox.lock);
	srv->thr.mbox.running = true;
	pthread_mutex_unlock(&srv->thr.mbox.lock);
}

/* fn on the owner's thread, its message kept for the caller (errbuf is
 * per thread); under mb->lock or not, the caller is woken after */
static void run_posted(struct rps__server *srv)
{
	struct srv_mbox *mb = &srv->thr.mbox;

	assert(mb->owned && pthread_equal(pthread_self(), mb->owner));	/* a posted call runs on its owner thread */
	rps__clearerr();
	mb->fn(srv, mb->arg);
	snprintf(mb->err, sizeof(mb->err), "%s", rps__errbuf());
}

void rps__srv_mbox_close(struct rps__server *srv)
{
	struct srv_mbox *mb = &srv->thr.mbox;

	pthread_mutex_lock(&mb->lock);
	mb->running = false;
	if (__atomic_load_n(&mb->pending, __ATOMIC_ACQUIRE)) {	/* asked as it stopped */
		run_posted(srv);
		__atomic_store_n(&mb->pending, false, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&mb->done);
	}
	pthread_mutex_unlock(&mb->lock);
}

void rps__srv_mbox_serve(struct rps__server *srv)
{
	struct srv_mbox *mb = &srv->thr.mbox;
	uint64_t v;
	ssize_t r = read(mb->fd, &v, sizeof(v));

	(void)r;
	run_posted(srv);
	pthread_mutex_lock(&mb->lock);
	__atomic_store_n(&mb->pending, false, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&mb->done);
	pthread_mutex_unlock(&mb->lock);
}

void rps__srv_mbox_call(struct rps__server *inst, rps__srv_mbox_fn fn, void *arg)
{
	struct srv_mbox *mb = &inst->thr.mbox;
	uint64_t one = 1;
	ssize_t r;

	if (inst == inst->thr.first || mb->fd < 0) {
		fn(inst, arg);
		return;
	}
	pthread_mutex_lock(&mb->lock);
	if (!mb->running) {
		pthread_mutex_unlock(&mb->lock);
		fn(inst, arg);
		return;
	}
	/* posted to our own thread, it would wait for itself */
	assert(!mb->owned || !pthread_equal(pthread_self(), mb->owner));
	mb->fn = fn;
	mb->arg = arg;
	__atomic_store_n(&mb->pending, true, __ATOMIC_RELEASE);
	r = write(mb->fd, &one, sizeof(one));
	(void)r;
	while (__atomic_load_n(&mb->pending, __ATOMIC_ACQUIRE))
		pthread_cond_wait(&mb->done, &mb->lock);
	if (mb->err[0])
		rps__seterr(0, "%s", mb->err);
	pthread_mutex_unlock(&mb->lock);
}
