/*
 * test_relay.c — the hierarchical commit (lib/commit/leader.c and the coordinator's
 * relay links): a coordinator on an ephemeral tcp port over a manifest in a temp
 * root, node leaders relaying for groups of ranks over unix sockets, the ranks in
 * threads of this process (or, for the kill -9, a leader in a child process).
 *
 * The honest protocol: W = 16 with nodes of 4 and W = 64 with nodes of 8 and of 4
 * commit step after step, with one decision sent per node; nodes mixed with ranks
 * of their own. Then bad leaders — out-of-range sets, sets without the leader's own
 * rank, overlapping sets (with another leader, with a rank's own connection), a
 * relayed vote or report for a rank outside the set, a vote relayed under another
 * rank's tag, relaying before announcing — after each of which nothing forged is
 * committed and the honest ranks still commit. Then failures: a rank of the wrong
 * node, a rank that forges through its leader, a leader killed with kill -9
 * mid-save, the coordinator lost behind a leader, a decision the leader drops.
 * Waits are generous and only guard against hangs. Threaded: also run under TSan
 * (label tsan).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commit/commit_internal.h"
#include "ranks.h"
#include "synth.h"
#include "testutil.h"

#define JOB    "job-relay-test"
#define SECRET "the relay test's secret"
#define TMO    30000          /* ms: a guard against hangs, never reached when passing */

/* ---------------------------------------------------------------- the job */

struct tenv {
	char *root;
	struct manifest *m;
	struct commit_coord *c;
	unsigned port;
	uint32_t world, node_size, nnodes;
	struct commit_leader **leaders;     /* [nnodes]; NULL: that node's ranks go direct */
	char (*addr)[108];                  /* [nnodes] the leaders' local addresses */
	struct ranks_env r;                 /* the honest ranks of ranks.c */
};

static int part_open_cb(const void *env, uint32_t rank, struct commit_part **out);

static uint32_t node_of(const struct tenv *e, uint32_t rank) { return rank / e->node_size; }
static uint32_t node_first(const struct tenv *e, uint32_t node) { return node * e->node_size; }
static uint32_t node_n(const struct tenv *e, uint32_t node)
{
	uint32_t f = node_first(e, node);
	return e->world - f < e->node_size ? e->world - f : e->node_size;
}

static void coord_start(struct tenv *e, unsigned timeout_ms)
{
	struct commit_coord_opts o = { .manifest = e->m, .job_id = JOB, .world = e->world,
	                               .secret = SECRET, .secret_len = strlen(SECRET),
	                               .transport = NET_TCP, .addr = "127.0.0.1", .port = 0,
	                               .timeout_ms = timeout_ms };
	int rc = commit_coord_start(&o, &e->c);
	ck_assert_msg(rc == 0, "commit_coord_start: %s", ckpt_err_msg());
	e->port = commit_coord_port(e->c);
	for (uint32_t k = 0; k < e->nnodes; k++)
		commit_leader_addr(e->addr[k], sizeof e->addr[k], JOB, e->port, node_first(e, k));
}

static struct commit_leader_opts leader_opts(const struct tenv *e, uint32_t node)
{
	return (struct commit_leader_opts){
		.transport = NET_TCP, .addr = "127.0.0.1", .port = e->port,
		.local_addr = e->addr[node], .job_id = JOB, .rank = node_first(e, node),
		.world = e->world, .node = node, .first = node_first(e, node),
		.nranks = node_n(e, node), .secret = SECRET, .secret_len = strlen(SECRET),
		.timeout_ms = 10000 };
}

static void leader_start(struct tenv *e, uint32_t node)
{
	struct commit_leader_opts o = leader_opts(e, node);
	int rc = commit_leader_start(&o, &e->leaders[node]);
	ck_assert_msg(rc == 0, "leader of node %u: %s", node, ckpt_err_msg());
}

/* nodes: how many of the nodes (the first ones) get a leader now. */
static void tenv_start(struct tenv *e, uint32_t world, uint32_t node_size, uint32_t nodes,
                       unsigned timeout_ms)
{
	memset(e, 0, sizeof *e);
	e->world = world;
	e->node_size = node_size;
	e->nnodes = (world + node_size - 1) / node_size;
	e->leaders = calloc(e->nnodes, sizeof *e->leaders);
	e->addr = calloc(e->nnodes, sizeof *e->addr);
	e->root = tu_tmpdir("commit-relay");
	ck_assert_msg(manifest_open(e->root, MANIFEST_CREATE, &e->m) == 0, "%s", ckpt_err_msg());
	coord_start(e, timeout_ms);
	for (uint32_t k = 0; k < nodes && k < e->nnodes; k++)
		leader_start(e, k);
	e->r = (struct ranks_env){ .m = e->m, .c = e->c, .world = world, .tmo_ms = TMO,
	                           .open = part_open_cb, .env = e };
}

static void tenv_stop(struct tenv *e)
{
	for (uint32_t k = 0; k < e->nnodes; k++)
		commit_leader_stop(e->leaders[k]);
	commit_coord_stop(e->c);
	manifest_close(e->m);
	tu_rmtree(e->root);
	free(e->root);
	free(e->leaders);
	free(e->addr);
	memset(e, 0, sizeof *e);
}

/* Rank's connection: through its node's leader when it has one, else its own. */
static int part_open(const struct tenv *e, uint32_t rank, struct commit_part **out)
{
	uint32_t k = node_of(e, rank);
	struct commit_part_opts o = { .transport = NET_TCP, .addr = "127.0.0.1", .port = e->port,
	                              .job_id = JOB, .rank = rank, .world = e->world,
	                              .secret = SECRET, .secret_len = strlen(SECRET),
	                              .timeout_ms = 10000 };
	if (e->leaders[k]) {
		o.transport = NET_UNIX;
		o.addr = e->addr[k];
		o.port = 0;
	}
	return commit_part_connect(&o, out);
}

static struct commit_part *part_connect(const struct tenv *e, uint32_t rank)
{
	struct commit_part *p = NULL;
	int rc = part_open(e, rank, &p);
	ck_assert_msg(rc == 0, "rank %u connect: %s", rank, ckpt_err_msg());
	return p;
}

static int part_open_cb(const void *env, uint32_t rank, struct commit_part **out)
{
	return part_open(env, rank, out);
}


/* The coordinator's timing of step (written just after the decision went out, so
 * a rank may have it first). */
static struct commit_coord_stats stats_of(const struct tenv *e, uint64_t step)
{
	struct commit_coord_stats st;
	for (int i = 0; i < TMO; i++) {
		if (commit_coord_last_stats(e->c, &st) == 0 && st.step == step)
			return st;
		usleep(1000);
	}
	ck_abort_msg("no timing of step %llu", (unsigned long long)step);
	return st;
}

static void expect_wait(struct commit_part *p, uint64_t step, int want, const char *needle)
{
	ranks_expect_wait(p, step, want, (const char *const[]){ needle, NULL }, TMO);
}

/* ---------------------------------------------------------------- fake leaders */

/* An authenticated rank that announces a set of ranks (net.h directly). *code and
 * reason get the coordinator's answer. */
static struct net_conn *fake_leader(const struct tenv *e, uint32_t rank, const uint32_t *ranks,
                                    uint32_t n, int *code, char reason[COMMIT_MAX_REASON + 1])
{
	struct net_conn *c;
	ck_assert_int_eq(net_connect(NET_TCP, NULL, "127.0.0.1", e->port, 10000, &c), 0);
	struct net_auth a = { .job_id = JOB, .rank = rank, .world = e->world, .secret = SECRET,
	                      .secret_len = strlen(SECRET) };
	int rc = net_handshake_client(c, &a, 10000);
	ck_assert_msg(rc == 0, "handshake: %s", ckpt_err_msg());
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ck_assert_int_eq(commit_hello_encode(9, ranks, n, &b), 0);
	ck_assert_int_eq(net_send(c, COMMIT_MSG_RELAY_HELLO, b.p, b.len, 10000), 0);
	ckpt_buf_free(&b);
	struct net_msg m;
	ck_assert_msg(net_recv(c, &m, TMO) == 0, "no answer to RELAY_HELLO: %s", ckpt_err_msg());
	ck_assert_uint_eq(m.type, COMMIT_MSG_RELAY_WELCOME);
	struct commit_status_msg st;
	ck_assert_int_eq(commit_status_decode(m.payload, m.len, &st), 0);
	net_msg_free(&m);
	*code = st.code;
	snprintf(reason, COMMIT_MAX_REASON + 1, "%s", st.reason);
	return c;
}


static void relay_send(struct net_conn *c, uint16_t outer, uint32_t rank, uint16_t type,
                       const struct ckpt_buf *inner)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ck_assert_int_eq(commit_relay_encode(rank, type, inner->p, inner->len, &b), 0);
	ck_assert_int_eq(net_send(c, outer, b.p, b.len, 10000), 0);
	ckpt_buf_free(&b);
}

/* Through fake leader c: rank's BEGIN of step, and its reply (TO_RANK). */
static void fake_begin(struct net_conn *c, uint32_t rank, uint64_t step)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ck_assert_int_eq(commit_step_encode(step, &b), 0);
	relay_send(c, COMMIT_MSG_RELAYED, rank, COMMIT_MSG_BEGIN, &b);
	ckpt_buf_free(&b);
	struct net_msg m;
	ck_assert_int_eq(net_recv(c, &m, TMO), 0);
	ck_assert_uint_eq(m.type, COMMIT_MSG_TO_RANK);
	uint32_t r;
	uint16_t type;
	const uint8_t *inner;
	size_t n;
	struct commit_status_msg st;
	ck_assert_int_eq(commit_relay_decode(m.payload, m.len, &r, &type, &inner, &n), 0);
	ck_assert_uint_eq(r, rank);
	ck_assert_uint_eq(type, COMMIT_MSG_BEGIN_REPLY);
	ck_assert_int_eq(commit_status_decode(inner, n, &st), 0);
	ck_assert_int_eq(st.code, 0);
	net_msg_free(&m);
}

/* ================================================================ honest protocol */

static void tree_commits(uint32_t world, uint32_t node_size)
{
	struct tenv e;
	tenv_start(&e, world, node_size, world / node_size, 10000);
	struct commit_part **p = calloc(world, sizeof *p);
	ranks_commit_all(&e.r, p, 1);
	ranks_commit_all(&e.r, p, 2);             /* the same connections, the next step */
	/* One decision per node, not per rank. */
	ck_assert_uint_eq(stats_of(&e, 2).sends, world / node_size);
	uint64_t left = commit_coord_ranks_left(e.c);
	ranks_close(p, world);
	ranks_wait_left(&e.r, left, world);
	free(p);
	ranks_honest_commit(&e.r, 3);             /* fresh connections through the same leaders */
	tenv_stop(&e);
}

START_TEST(tree_w16_nodes_of_4) { tree_commits(16, 4); }
END_TEST

START_TEST(tree_w64_nodes_of_8) { tree_commits(64, 8); }
END_TEST

/* 16 leaders, 4 ranks each. */
START_TEST(tree_w64_nodes_of_4) { tree_commits(64, 4); }
END_TEST

START_TEST(nodes_mixed_with_own_links)
{
	/* Nodes 0 and 1 relay, node 2's ranks join on their own: 2 + 4 links. */
	struct tenv e;
	tenv_start(&e, 12, 4, 2, 10000);
	ranks_honest_commit(&e.r, 1);
	ck_assert_uint_eq(stats_of(&e, 1).sends, 2 + 4);
	tenv_stop(&e);
}
END_TEST

/* ================================================================ bad leaders */

START_TEST(leader_sets_refused)
{
	/* W = 8, nodes of 4: node 0 has a real leader. Each announcement below is
	 * refused with its reason and its link closed; the job still commits. */
	struct tenv e;
	tenv_start(&e, 8, 4, 1, 10000);
	struct commit_part *own = part_connect(&e, 6);   /* rank 6 on its own link */
	static const struct {
		const char *what;
		uint32_t rank, n, ranks[5];
		const char *needle;
	} cases[] = {
		{ "out of range", 4, 4, { 4, 5, 7, 8 }, "out of range" },
		{ "without its own rank", 4, 2, { 5, 7 }, "its own rank 4" },
		{ "overlapping another leader's", 4, 3, { 3, 4, 5 }, "rank 3 is already connected "
		  "through another leader" },
		{ "overlapping a rank's own link", 4, 4, { 4, 5, 6, 7 }, "rank 6 is already connected" },
	};
	for (size_t k = 0; k < CKPT_ARRAY_SIZE(cases); k++) {
		int code;
		char reason[COMMIT_MAX_REASON + 1];
		struct net_conn *c = fake_leader(&e, cases[k].rank, cases[k].ranks, cases[k].n, &code,
		                                 reason);
		ck_assert_msg(code == CKPT_EPEER, "%s: code %d (%s)", cases[k].what, code, reason);
		ck_assert_msg(strstr(reason, cases[k].needle), "%s: '%s' lacks '%s'", cases[k].what,
		              reason, cases[k].needle);
		ranks_expect_dropped(c, TMO, "a misbehaving leader's link");
		net_close(c);
	}
	/* Two real leaders claiming the same ranks: a second leader of node 0 (on a
	 * name of its own) cannot even join as rank 0; a leader of ranks 2..5 joins
	 * as rank 4 but its announcement is refused: ranks 2 and 3 are served. */
	struct commit_leader_opts o = leader_opts(&e, 0);
	char other[108];
	snprintf(other, sizeof other, "%s-second", e.addr[0]);
	o.local_addr = other;
	struct commit_leader *dup = (struct commit_leader *)1;
	int rc = commit_leader_start(&o, &dup);
	ck_assert_msg(rc == CKPT_EPEER, "second leader of node 0: %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "rank 0 refused: that rank is already connected"), "%s",
	              ckpt_err_msg());
	ck_assert_ptr_null(dup);
	o.first = 2;
	o.rank = 4;
	o.node = 7;
	rc = commit_leader_start(&o, &dup);
	ck_assert_msg(rc == CKPT_EPEER, "leader of ranks 2..5: %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "refused by the coordinator") &&
	              strstr(ckpt_err_msg(), "rank 2 is already connected through another leader"),
	              "%s", ckpt_err_msg());
	ck_assert_ptr_null(dup);
	o = leader_opts(&e, 0);
	/* ... and one on the same local name cannot even listen. */
	o.local_addr = e.addr[0];
	rc = commit_leader_start(&o, &dup);
	ck_assert_msg(rc == -EADDRINUSE, "same-name leader: %d (%s)", rc, ckpt_err_msg());
	/* A rank of a leader's node may not join on its own. */
	struct commit_part_opts po = { .transport = NET_TCP, .addr = "127.0.0.1", .port = e.port,
	                               .job_id = JOB, .rank = 2, .world = 8, .secret = SECRET,
	                               .secret_len = strlen(SECRET), .timeout_ms = 10000 };
	struct commit_part *p = NULL;
	rc = commit_part_connect(&po, &p);
	ck_assert_msg(rc == CKPT_EPEER, "rank 2 direct: %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "already served by its node leader"), "%s",
	              ckpt_err_msg());
	/* The honest job: node 0 through its leader, ranks 4..7 on their own. */
	struct commit_part *parts[8] = { 0 };
	parts[6] = own;
	ranks_commit_all(&e.r, parts, 1);
	ranks_close(parts, 8);
	tenv_stop(&e);
}
END_TEST

START_TEST(rank_of_another_node_refused_by_the_leader)
{
	struct tenv e;
	tenv_start(&e, 8, 4, 2, 10000);
	struct commit_part_opts o = { .transport = NET_UNIX, .addr = e.addr[0], .job_id = JOB,
	                              .rank = 5, .world = 8, .secret = SECRET,
	                              .secret_len = strlen(SECRET), .timeout_ms = 10000 };
	struct commit_part *p = (struct commit_part *)1;
	int rc = commit_part_connect(&o, &p);
	ck_assert_msg(rc == CKPT_EPEER, "rank 5 at node 0's leader: %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "does not belong"), "%s", ckpt_err_msg());
	ck_assert_ptr_null(p);
	/* The wrong secret, at a leader. */
	o.rank = 1;
	o.secret = "not the secret";
	o.secret_len = strlen(o.secret);
	rc = commit_part_connect(&o, &p);
	ck_assert_msg(rc == CKPT_EAUTH, "wrong secret at a leader: %d (%s)", rc, ckpt_err_msg());
	/* A duplicate rank, at a leader. */
	struct commit_part *one = part_connect(&e, 1);
	o.secret = SECRET;
	o.secret_len = strlen(SECRET);
	rc = commit_part_connect(&o, &p);
	ck_assert_msg(rc == CKPT_EPEER, "rank 1 twice: %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "already connected"), "%s", ckpt_err_msg());
	struct commit_part *parts[8] = { 0 };
	parts[1] = one;
	ranks_commit_all(&e.r, parts, 1);
	ranks_close(parts, 8);
	tenv_stop(&e);
}
END_TEST

/* What a fake leader of ranks 4..7 does wrong, after a good announcement. */
enum bad_relay {
	BR_VOTE_OUTSIDE_SET, BR_VOTE_UNDER_ANOTHER_TAG, BR_GONE_OUTSIDE_SET, BR_BAD_INNER_TYPE,
	BR_UNTAGGED_VOTE, BR_TRUNCATED_TAG, BR_SECOND_HELLO, BR_COUNT_
};

START_TEST(bad_relayed_messages)
{
	enum bad_relay k = (enum bad_relay)_i;
	struct tenv e;
	tenv_start(&e, 8, 4, 1, 30000);
	uint64_t step = 10;
	struct commit_part *p[8] = { 0 };
	for (uint32_t r = 0; r < 4; r++) {
		p[r] = part_connect(&e, r);
		ck_assert_int_eq(ranks_begin(p[r], step), 0);
	}
	uint32_t set[4] = { 4, 5, 6, 7 };
	int code;
	char reason[COMMIT_MAX_REASON + 1];
	struct net_conn *fake = fake_leader(&e, 4, set, 4, &code, reason);
	ck_assert_msg(code == 0, "announcement refused: %s", reason);
	for (uint32_t r = 4; r < 8; r++)
		fake_begin(fake, r, step);
	for (uint32_t r = 0; r < 4; r++)
		ck_assert_int_eq(ranks_prepare(p[r], step, r, 8), 0);
	struct rank_vote rv;
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	switch (k) {
	case BR_VOTE_OUTSIDE_SET:         /* rank 2's vote, forged, tagged rank 2 */
	case BR_VOTE_UNDER_ANOTHER_TAG:   /* rank 6's vote, tagged rank 5 */
	case BR_UNTAGGED_VOTE:            /* a PREPARE of its own, not RELAYED */
		ranks_vote_make(&rv, step, k == BR_VOTE_OUTSIDE_SET ? 2 : k == BR_UNTAGGED_VOTE ? 4 : 6, 8,
		                commit_part_attempt(p[0], step));
		rv.v.file_size = 666;
		ck_assert_int_eq(commit_prepare_encode(&rv.v, &b), 0);
		if (k == BR_UNTAGGED_VOTE)
			ck_assert_int_eq(net_send(fake, COMMIT_MSG_PREPARE, b.p, b.len, 10000), 0);
		else
			relay_send(fake, COMMIT_MSG_RELAYED, k == BR_VOTE_OUTSIDE_SET ? 2 : 5,
			           COMMIT_MSG_PREPARE, &b);
		ranks_vote_free(&rv);
		break;
	case BR_GONE_OUTSIDE_SET:
		ck_assert_int_eq(commit_gone_encode(1, "made up", &b), 0);
		ck_assert_int_eq(net_send(fake, COMMIT_MSG_RANK_GONE, b.p, b.len, 10000), 0);
		break;
	case BR_BAD_INNER_TYPE: {
		struct commit_status_msg st = { .step = step, .code = 0 };
		ck_assert_int_eq(commit_status_encode(&st, &b), 0);
		relay_send(fake, COMMIT_MSG_RELAYED, 5, COMMIT_MSG_DECISION, &b);
		break;
	}
	case BR_TRUNCATED_TAG: {
		uint8_t t[5] = { 1, 0, 5, 0, 0 };
		ck_assert_int_eq(net_send(fake, COMMIT_MSG_RELAYED, t, sizeof t, 10000), 0);
		break;
	}
	default: {
		uint32_t again[1] = { 4 };
		ck_assert_int_eq(commit_hello_encode(9, again, 1, &b), 0);
		ck_assert_int_eq(net_send(fake, COMMIT_MSG_RELAY_HELLO, b.p, b.len, 10000), 0);
	}
	}
	ckpt_buf_free(&b);
	ranks_expect_dropped(fake, TMO, "a misbehaving leader's link");
	net_close(fake);
	/* Ranks 4..7 went with the link, before voting: the step aborts at once (not
	 * after the 30 s timeout), and nothing forged is in the manifest. */
	for (uint32_t r = 0; r < 4; r++)
		expect_wait(p[r], step, CKPT_EABORTED, "disconnected");
	ranks_assert_not_committed(&e.r, step);
	/* The node comes back with an honest leader; everyone commits. */
	leader_start(&e, 1);
	ranks_commit_all(&e.r, p, step + 1);
	ranks_close(p, 8);
	tenv_stop(&e);
}
END_TEST

START_TEST(rank_forging_through_its_leader)
{
	/* Rank 5 votes in rank 6's name: its leader closes its connection and reports
	 * it gone; the step aborts; nothing forged is committed. */
	struct tenv e;
	tenv_start(&e, 8, 4, 2, 30000);
	uint64_t step = 20;
	struct commit_part *p[8] = { 0 };
	for (uint32_t r = 0; r < 8; r++) {
		p[r] = part_connect(&e, r);
		ck_assert_int_eq(ranks_begin(p[r], step), 0);
	}
	struct rank_vote forged;
	ranks_vote_make(&forged, step, 6, 8, commit_part_attempt(p[5], step));
	forged.v.file_size = 666;
	ck_assert_int_eq(commit_part_prepare(p[5], &forged.v), 0);
	free(forged.buf);
	for (uint32_t r = 0; r < 8; r++)
		if (r != 5)
			ck_assert_int_eq(ranks_prepare(p[r], step, r, 8), 0);
	for (uint32_t r = 0; r < 8; r++)
		if (r != 5)
			expect_wait(p[r], step, CKPT_EABORTED, "rank 5");
	int rc = commit_part_wait(p[5], step, TMO);
	ck_assert_msg(rc == CKPT_EINDOUBT || rc == CKPT_EABORTED, "rank 5: %d", rc);
	ranks_assert_not_committed(&e.r, step);
	commit_part_close(p[5]);
	p[5] = NULL;
	ranks_commit_all(&e.r, p, step + 1);
	ranks_close(p, 8);
	tenv_stop(&e);
}
END_TEST

/* ================================================================ failures */

START_TEST(leader_killed_mid_save)
{
	/* Node 1's leader runs in a child process (forked before any thread: TSan
	 * does not start threads after a multi-threaded fork) and is killed with
	 * SIGKILL after its ranks 4, 5 voted and before 6, 7 did. */
	int to_child[2], from_child[2];
	ck_assert_int_eq(pipe(to_child), 0);
	ck_assert_int_eq(pipe(from_child), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct tenv ce;
		memset(&ce, 0, sizeof ce);
		ce.world = 8;
		ce.node_size = 4;
		ce.nnodes = 2;
		char addr[2][108];
		ce.addr = addr;
		if (read(to_child[0], &ce.port, sizeof ce.port) != sizeof ce.port)
			_exit(2);
		commit_leader_addr(addr[1], sizeof addr[1], JOB, ce.port, 4);
		struct commit_leader_opts o = leader_opts(&ce, 1);
		struct commit_leader *l;
		char ok = commit_leader_start(&o, &l) == 0 ? 'y' : 'n';
		if (write(from_child[1], &ok, 1) != 1)
			_exit(2);
		pause();
		_exit(0);
	}
	struct tenv e;
	tenv_start(&e, 8, 4, 1, 60000);
	ck_assert_int_eq(write(to_child[1], &e.port, sizeof e.port), (ssize_t)sizeof e.port);
	char ok = 0;
	ck_assert_int_eq(read(from_child[0], &ok, 1), 1);
	ck_assert_int_eq(ok, 'y');
	/* The child's leader serves node 1: its ranks connect to its address. */
	e.leaders[1] = (struct commit_leader *)1;
	uint64_t step = 30;
	struct commit_part *p[8] = { 0 };
	for (uint32_t r = 0; r < 8; r++) {
		p[r] = part_connect(&e, r);
		ck_assert_int_eq(ranks_begin(p[r], step), 0);
	}
	e.leaders[1] = NULL;
	for (uint32_t r = 0; r < 6; r++)
		ck_assert_int_eq(ranks_prepare(p[r], step, r, 8), 0);
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFSIGNALED(st));
	/* Voted through the dead leader: in doubt; not yet voted: aborted; the other
	 * node: aborted by the coordinator, which lost ranks 6 and 7. */
	expect_wait(p[4], step, CKPT_EINDOUBT, "the manifest decides");
	expect_wait(p[5], step, CKPT_EINDOUBT, "the manifest decides");
	expect_wait(p[6], step, CKPT_EABORTED, "before voting");
	expect_wait(p[7], step, CKPT_EABORTED, "before voting");
	for (uint32_t r = 0; r < 4; r++)
		expect_wait(p[r], step, CKPT_EABORTED, "disconnected");
	/* The manifest decides: not committed. */
	ranks_assert_not_committed(&e.r, step);
	for (uint32_t r = 4; r < 8; r++) {
		commit_part_close(p[r]);
		p[r] = NULL;
	}
	/* A new leader for node 1; everyone commits. */
	leader_start(&e, 1);
	ranks_commit_all(&e.r, p, step + 1);
	ranks_close(p, 8);
	tenv_stop(&e);
	close(to_child[0]);
	close(to_child[1]);
	close(from_child[0]);
	close(from_child[1]);
}
END_TEST

START_TEST(coordinator_lost_behind_a_leader)
{
	struct tenv e;
	tenv_start(&e, 4, 2, 2, 10000);
	struct commit_part *p[4] = { 0 };
	for (uint32_t r = 0; r < 4; r++) {
		p[r] = part_connect(&e, r);
		ck_assert_int_eq(ranks_begin(p[r], 9), 0);
	}
	ck_assert_int_eq(ranks_prepare(p[0], 9, 0, 4), 0);
	ck_assert_int_eq(ranks_prepare(p[2], 9, 2, 4), 0);
	commit_coord_stop(e.c);
	e.c = e.r.c = NULL;
	expect_wait(p[0], 9, CKPT_EINDOUBT, "the manifest decides");
	expect_wait(p[2], 9, CKPT_EINDOUBT, "the manifest decides");
	expect_wait(p[1], 9, CKPT_EABORTED, "before voting");
	expect_wait(p[3], 9, CKPT_EABORTED, "before voting");
	ranks_assert_not_committed(&e.r, 9);      /* presumed abort */
	/* A leader without a coordinator refuses ranks, with the reason. */
	commit_part_close(p[1]);
	p[1] = NULL;
	struct commit_part *again = (struct commit_part *)1;
	int rc = part_open(&e, 1, &again);
	ck_assert_msg(rc == CKPT_EPEER, "%d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "lost the coordinator"), "%s", ckpt_err_msg());
	ranks_close(p, 4);
	tenv_stop(&e);
}
END_TEST

START_TEST(decision_dropped_by_the_leader)
{
	/* The step commits; node 1's leader drops the decision (fault point
	 * leader_before_decision_relay; armed before any thread runs): node 1's ranks
	 * are in doubt, node 0's know; the manifest says committed. */
	setenv("CKPT_FAULT", "leader_before_decision_relay:1:drop", 1);
	ckpt_fault_reload();
	struct tenv e;
	tenv_start(&e, 4, 2, 0, 10000);
	/* Only node 1 relays (node 0's ranks join on their own), so the fault's first
	 * hit in this process is node 1's leader's. */
	leader_start(&e, 1);
	struct commit_part *p[4] = { 0 };
	for (uint32_t r = 0; r < 4; r++) {
		p[r] = part_connect(&e, r);
		ck_assert_int_eq(ranks_begin(p[r], 4), 0);
	}
	for (uint32_t r = 0; r < 4; r++)
		ck_assert_int_eq(ranks_prepare(p[r], 4, r, 4), 0);
	expect_wait(p[0], 4, 0, NULL);
	expect_wait(p[1], 4, 0, NULL);
	for (uint32_t r = 2; r < 4; r++) {
		int rc = commit_part_wait(p[r], 4, 1500);
		ck_assert_msg(rc == CKPT_EINDOUBT, "rank %u: %d (%s)", r, rc, ckpt_err_msg());
	}
	ranks_assert_committed(&e.r, 4);
	ranks_commit_all(&e.r, p, 5);             /* the next decision goes through */
	ranks_close(p, 4);
	tenv_stop(&e);
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}
END_TEST

/* ================================================================ main */

int main(void)
{
	tu_seed();
	ckpt_fault_reload();
	Suite *s = suite_create("commit_relay");
	TCase *tc = tcase_create("protocol");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, tree_w16_nodes_of_4);
	tcase_add_test(tc, tree_w64_nodes_of_8);
	tcase_add_test(tc, tree_w64_nodes_of_4);
	tcase_add_test(tc, nodes_mixed_with_own_links);
	suite_add_tcase(s, tc);
	TCase *bl = tcase_create("bad_leaders");
	tcase_set_timeout(bl, 120);
	tcase_add_test(bl, leader_sets_refused);
	tcase_add_test(bl, rank_of_another_node_refused_by_the_leader);
	tcase_add_loop_test(bl, bad_relayed_messages, 0, BR_COUNT_);
	tcase_add_test(bl, rank_forging_through_its_leader);
	suite_add_tcase(s, bl);
	TCase *f = tcase_create("failures");
	tcase_set_timeout(f, 120);
	tcase_add_test(f, leader_killed_mid_save);
	tcase_add_test(f, coordinator_lost_behind_a_leader);
	tcase_add_test(f, decision_dropped_by_the_leader);
	suite_add_tcase(s, f);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
