/*
 * test_participant_order.c — the participant (lib/commit/participant.c) against a
 * scripted coordinator that replays, deterministically, message orders the crash
 * matrix only hits by chance on a busy machine:
 *   - the abort decision of a step arrives BEFORE the reply to this rank's BEGIN
 *     (the coordinator aborted the step because another rank failed while this
 *     rank's BEGIN was on the way, then took that BEGIN as a new attempt): the
 *     begin must fail with the coordinator's reason (not a blank one), the rank
 *     must not write or vote, and it must send ABORT so that the new attempt does
 *     not wait for votes;
 *   - the abort decision arrives after BEGIN's reply but before the vote: no
 *     PREPARE goes out, and the wait reports the coordinator's reason;
 *   - BEGIN is never answered: the begin times out, and the rank sends ABORT for the
 *     step, so that an attempt the coordinator may have opened does not hold the
 *     steps after it;
 *   - a rank gives an attempt up (its ABORT, or a stale begin's) and begins the step
 *     again at once: that attempt's decision, between the new BEGIN and its reply,
 *     is not the new attempt's; and a rank that voted and then gave up still takes
 *     its attempt's decision.
 * The script is ordered by the TCP stream itself (a second BEGIN serves as a
 * barrier), never by sleeps.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit_internal.h"
#include "testutil.h"

#define JOB "order-test"
#define TMO 5000

struct script {
	struct net_listener *lis;
	int                  scenario;
	/* results, read after join */
	int                  err;
	char                 what[256];
	unsigned             aborts_for_7, prepares_for_8;
};

static int any_rank(void *arg, uint32_t rank, const char **why)
{
	(void)arg; (void)rank; (void)why;
	return 0;
}

/* Attempt ids: BEGIN_REPLY opens attempt ATTEMPT(step); an older one was decided. */
#define ATTEMPT(step) (0x5a00u + (step))
#define OLDER(step)   (0x4a00u + (step))
#define NEWER(step)   (0x6a00u + (step))   /* the attempt after ATTEMPT(step) */

static int send_status(struct net_conn *c, uint16_t type, uint64_t step, uint64_t save_id,
                       int code, const char *why)
{
	struct commit_status_msg m = { .step = step, .code = code, .save_id = save_id };
	snprintf(m.reason, sizeof m.reason, "%s", why);
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	int rc = commit_status_encode(&m, &b);
	if (!rc)
		rc = net_send(c, type, b.p, b.len, TMO);
	ckpt_buf_free(&b);
	return rc;
}

static uint64_t s_last_abort;   /* the save id of the last ABORT received */

/* Receive one message; its step (BEGIN: the payload; others: the status/vote). */
static int recv_step(struct net_conn *c, uint16_t *type, uint64_t *step)
{
	struct net_msg m;
	int rc = net_recv(c, &m, TMO);
	if (rc)
		return rc;
	*type = m.type;
	struct commit_status_msg st;
	struct commit_vote v;
	if (m.type == COMMIT_MSG_BEGIN)
		rc = commit_step_decode(m.payload, m.len, step);
	else if (m.type == COMMIT_MSG_PREPARE && !(rc = commit_prepare_decode(m.payload, m.len, &v)))
		*step = v.step;
	else if (m.type == COMMIT_MSG_ABORT && !(rc = commit_status_decode(m.payload, m.len, &st)))
		*step = st.step;
	/* An ABORT names the attempt it gives up: the one this rank's BEGIN opened. */
	if (!rc && m.type == COMMIT_MSG_ABORT)
		s_last_abort = st.save_id;
	if (!rc && m.type == COMMIT_MSG_ABORT && st.save_id && st.save_id != ATTEMPT(st.step) &&
	    st.save_id != NEWER(st.step))
		rc = -EBADMSG;
	net_msg_free(&m);
	return rc;
}

/* Scenarios 4 and 5, a line per message from the rank: what it must be (an ABORT: of which
 * attempt, 0 any), and what the coordinator answers, in order. */
struct line {
	uint16_t want;
	uint64_t step, abort_of;
	/* step: 0 for the line's */
	struct { uint16_t type; uint64_t save_id; int code; const char *why; uint64_t step; } send[2];
};
static const struct line given_up[] = {
	/* BEGIN 80 -> reply; the rank gives the attempt up and begins again at once: the
	 * given-up attempt's decision comes before the reply opening the next one; the
	 * rank votes for that one and gets its decision. */
	{ COMMIT_MSG_BEGIN, 80, 0, { { COMMIT_MSG_BEGIN_REPLY, ATTEMPT(80), 0, "", 0 } } },
	{ COMMIT_MSG_ABORT, 80, ATTEMPT(80), { { 0, 0, 0, NULL, 0 } } },
	{ COMMIT_MSG_BEGIN, 80, 0, { { COMMIT_MSG_DECISION, ATTEMPT(80), CKPT_EABORTED, "rank 1 gave up", 0 },
	                             { COMMIT_MSG_BEGIN_REPLY, NEWER(80), 0, "", 0 } } },
	{ COMMIT_MSG_PREPARE, 80, 0, { { COMMIT_MSG_DECISION, NEWER(80), 0, "", 0 } } },
	/* BEGIN 81 -> the decision of an attempt the rank never knew, then the reply: the
	 * rank ABORTs what its BEGIN opened and begins again, and that abort's decision
	 * comes between the BEGIN and the reply. */
	{ COMMIT_MSG_BEGIN, 81, 0, { { COMMIT_MSG_DECISION, OLDER(81), CKPT_EABORTED, "rank 2 failed", 0 },
	                             { COMMIT_MSG_BEGIN_REPLY, ATTEMPT(81), 0, "", 0 } } },
	{ COMMIT_MSG_ABORT, 81, ATTEMPT(81), { { 0, 0, 0, NULL, 0 } } },
	{ COMMIT_MSG_BEGIN, 81, 0, { { COMMIT_MSG_DECISION, ATTEMPT(81), CKPT_EABORTED, "rank 1 gave up", 0 },
	                             { COMMIT_MSG_BEGIN_REPLY, NEWER(81), 0, "", 0 } } },
	{ COMMIT_MSG_ABORT, 81, NEWER(81), { { 0, 0, 0, NULL, 0 } } },
	/* BEGIN 82 -> reply; the rank votes, then gives up; the decision commits. */
	{ COMMIT_MSG_BEGIN, 82, 0, { { COMMIT_MSG_BEGIN_REPLY, ATTEMPT(82), 0, "", 0 } } },
	{ COMMIT_MSG_PREPARE, 82, 0, { { 0, 0, 0, NULL, 0 } } },
	{ COMMIT_MSG_ABORT, 82, ATTEMPT(82), { { COMMIT_MSG_DECISION, ATTEMPT(82), 0, "", 0 } } },
};
/* BEGIN 90 -> reply; BEGIN 91 (a barrier: the rank asked for 90's decision before)
 * -> 90's abort decision, then 91's reply; the rank gives 91 up. */
static const struct line decided[] = {
	{ COMMIT_MSG_BEGIN, 90, 0, { { COMMIT_MSG_BEGIN_REPLY, ATTEMPT(90), 0, "", 0 } } },
	{ COMMIT_MSG_BEGIN, 91, 0, { { COMMIT_MSG_DECISION, ATTEMPT(90), CKPT_EABORTED, "rank 2 failed", 90 },
	                             { COMMIT_MSG_BEGIN_REPLY, ATTEMPT(91), 0, "", 0 } } },
	{ COMMIT_MSG_ABORT, 91, ATTEMPT(91), { { 0, 0, 0, NULL, 0 } } },
};

#define SCRIPT_FAIL(...) do { s->err = 1; snprintf(s->what, sizeof s->what, __VA_ARGS__); goto out; } while (0)

static void *coordinator_script(void *arg)
{
	struct script *s = arg;
	struct net_conn *c = NULL;
	uint32_t rank;
	uint16_t type;
	uint64_t step;
	if (net_accept(s->lis, TMO, &c))
		SCRIPT_FAIL("accept: %s", ckpt_err_msg());
	struct net_auth a = { .job_id = JOB, .world = 3 };
	if (net_handshake_server(c, &a, any_rank, NULL, &rank, TMO))
		SCRIPT_FAIL("handshake: %s", ckpt_err_msg());
	if (s->scenario == 3) {
		/* BEGIN 7, and silence. */
		if (recv_step(c, &type, &step) || type != COMMIT_MSG_BEGIN || step != 7)
			SCRIPT_FAIL("want BEGIN 7, got type %u step %llu", type, (unsigned long long)step);
	} else if (s->scenario == 1) {
		/* BEGIN 7 -> DECISION(7, abort) first, then BEGIN_REPLY(7, ok). */
		if (recv_step(c, &type, &step) || type != COMMIT_MSG_BEGIN || step != 7)
			SCRIPT_FAIL("want BEGIN 7, got type %u step %llu", type, (unsigned long long)step);
		if (send_status(c, COMMIT_MSG_DECISION, 7, OLDER(7), CKPT_EABORTED,
		                "rank 2 failed: disk on fire") ||
		    send_status(c, COMMIT_MSG_BEGIN_REPLY, 7, ATTEMPT(7), 0, ""))
			SCRIPT_FAIL("send: %s", ckpt_err_msg());
	} else if (s->scenario == 4 || s->scenario == 5) {
		const struct line *lines = s->scenario == 4 ? given_up : decided;
		size_t n = s->scenario == 4 ? sizeof given_up / sizeof given_up[0]
		                            : sizeof decided / sizeof decided[0];
		for (size_t i = 0; i < n; i++) {
			const struct line *l = &lines[i];
			if (recv_step(c, &type, &step) || type != l->want || step != l->step ||
			    (l->abort_of && s_last_abort != l->abort_of))
				SCRIPT_FAIL("line %zu: want type %u step %llu, got type %u step %llu", i,
				            l->want, (unsigned long long)l->step, type,
				            (unsigned long long)step);
			for (int k = 0; k < 2 && l->send[k].type; k++)
				if (send_status(c, l->send[k].type, l->send[k].step ? l->send[k].step : l->step,
				                l->send[k].save_id,
				                l->send[k].code, l->send[k].why))
					SCRIPT_FAIL("send: %s", ckpt_err_msg());
		}
	} else {
		/* BEGIN 8 -> reply ok; BEGIN 9 -> DECISION(8, abort), then reply ok to 9 (the
		 * barrier: the decision reaches the rank after its begin of 8 returned). */
		if (recv_step(c, &type, &step) || type != COMMIT_MSG_BEGIN || step != 8)
			SCRIPT_FAIL("want BEGIN 8, got type %u step %llu", type, (unsigned long long)step);
		if (send_status(c, COMMIT_MSG_BEGIN_REPLY, 8, ATTEMPT(8), 0, ""))
			SCRIPT_FAIL("send: %s", ckpt_err_msg());
		if (recv_step(c, &type, &step) || type != COMMIT_MSG_BEGIN || step != 9)
			SCRIPT_FAIL("want BEGIN 9, got type %u step %llu", type, (unsigned long long)step);
		if (send_status(c, COMMIT_MSG_DECISION, 8, ATTEMPT(8), CKPT_EABORTED,
		                "rank 1 failed: write error") ||
		    send_status(c, COMMIT_MSG_BEGIN_REPLY, 9, ATTEMPT(9), 0, ""))
			SCRIPT_FAIL("send: %s", ckpt_err_msg());
	}
	/* Everything else the rank sends, until it hangs up. */
	for (;;) {
		int rc = recv_step(c, &type, &step);
		if (rc == -ECONNRESET)
			break;
		if (rc)
			SCRIPT_FAIL("recv: %s", ckpt_err_msg());
		if (type == COMMIT_MSG_ABORT && step == 7)
			s->aborts_for_7++;
		if (type == COMMIT_MSG_PREPARE && step == 8)
			s->prepares_for_8++;
	}
out:
	net_close(c);
	return NULL;
}

static struct commit_part *start_tmo(struct script *s, pthread_t *t, int scenario,
                                     unsigned timeout_ms)
{
	memset(s, 0, sizeof *s);
	s->scenario = scenario;
	ck_assert_int_eq(net_listen(NET_TCP, NULL, "127.0.0.1", 0, &s->lis), 0);
	ck_assert_int_eq(pthread_create(t, NULL, coordinator_script, s), 0);
	struct commit_part_opts o = { .transport = NET_TCP, .addr = "127.0.0.1",
	                              .port = net_listener_port(s->lis), .job_id = JOB,
	                              .rank = 1, .world = 3, .timeout_ms = timeout_ms };
	struct commit_part *p = NULL;
	int rc = commit_part_connect(&o, &p);
	ck_assert_msg(rc == 0, "connect: %s", ckpt_err_msg());
	return p;
}

static struct commit_part *start(struct script *s, pthread_t *t, int scenario)
{
	return start_tmo(s, t, scenario, TMO);
}

static void finish(struct script *s, pthread_t t, struct commit_part *p)
{
	commit_part_close(p);
	pthread_join(t, NULL);
	net_listener_close(s->lis);
	ck_assert_msg(!s->err, "scripted coordinator: %s", s->what);
}

START_TEST(decision_before_begin_reply)
{
	struct script s;
	pthread_t t;
	struct commit_part *p = start(&s, &t, 1);
	uint64_t id;
	int rc = commit_part_begin(p, 7, &id);
	const char *msg = ckpt_err_msg();
	ck_assert_msg(rc == CKPT_EABORTED, "begin of an aborted step: rc %d (%s)", rc, msg);
	ck_assert_msg(strstr(msg, "disk on fire"), "the coordinator's reason is lost: '%s'", msg);
	finish(&s, t, p);
	ck_assert_msg(s.aborts_for_7 == 1, "the rank sent %u ABORT for step 7, want 1", s.aborts_for_7);
}
END_TEST

START_TEST(decision_before_vote)
{
	struct script s;
	pthread_t t;
	struct commit_part *p = start(&s, &t, 2);
	uint64_t id8, id9;
	ck_assert_int_eq(commit_part_begin(p, 8, &id8), 0);
	ck_assert_uint_eq(id8, ATTEMPT(8));
	/* DECISION 8 precedes the reply to BEGIN 9 on the stream: once begin(9)
	 * returns, the decision has been filed. */
	ck_assert_int_eq(commit_part_begin(p, 9, &id9), 0);
	uint8_t idx[16] = { 1, 2, 3 };
	struct commit_vote v = { .rank = 1, .step = 8, .save_id = id8, .index = idx,
	                         .index_len = sizeof idx, .file_size = 4096 };
	ck_assert_int_eq(commit_part_prepare(p, &v), 0);
	int rc = commit_part_wait(p, 8, TMO);
	const char *msg = ckpt_err_msg();
	ck_assert_msg(rc == CKPT_EABORTED, "wait: rc %d (%s)", rc, msg);
	ck_assert_msg(strstr(msg, "rank 1 failed: write error"), "reason: '%s'", msg);
	commit_part_abort(p, 9, CKPT_EABORTED, "test over");
	finish(&s, t, p);
	ck_assert_msg(s.prepares_for_8 == 0, "the rank voted for a step already aborted");
}
END_TEST

START_TEST(begin_never_answered)
{
	struct script s;
	pthread_t t;
	struct commit_part *p = start_tmo(&s, &t, 3, 300);
	uint64_t id;
	int rc = commit_part_begin(p, 7, &id);
	const char *msg = ckpt_err_msg();
	ck_assert_msg(rc == -ETIMEDOUT, "begin without an answer: rc %d (%s)", rc, msg);
	ck_assert_msg(strstr(msg, "no answer to BEGIN"), "message: '%s'", msg);
	finish(&s, t, p);
	ck_assert_msg(s.aborts_for_7 == 1, "the rank sent %u ABORT for step 7, want 1", s.aborts_for_7);
}
END_TEST

/* start, and the rank's begin of step, answered with ATTEMPT(step). */
static struct commit_part *start_begun(struct script *s, pthread_t *t, int scenario,
                                       uint64_t step)
{
	struct commit_part *p = start(s, t, scenario);
	uint64_t id;
	int rc = commit_part_begin(p, step, &id);
	ck_assert_msg(rc == 0, "begin %llu: rc %d (%s)", (unsigned long long)step, rc,
	              ckpt_err_msg());
	ck_assert_uint_eq(id, ATTEMPT(step));
	return p;
}

START_TEST(decision_of_a_given_up_attempt)
{
	struct script s;
	pthread_t t;
	struct commit_part *p = start_begun(&s, &t, 4, 80);
	uint64_t id;
	ck_assert_int_eq(commit_part_abort(p, 80, CKPT_EABORTED, "this rank gives up"), 0);
	/* Again at once: the given-up attempt's decision comes before the reply. */
	int rc = commit_part_begin(p, 80, &id);
	ck_assert_msg(rc == 0, "begin after giving an attempt up: rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_uint_eq(id, NEWER(80));
	uint8_t idx[16] = { 1, 2, 3 };
	struct commit_vote v = { .rank = 1, .step = 80, .save_id = id, .index = idx,
	                         .index_len = sizeof idx, .file_size = 4096 };
	ck_assert_int_eq(commit_part_prepare(p, &v), 0);
	rc = commit_part_wait(p, 80, TMO);
	ck_assert_msg(rc == 0, "the new attempt's own decision: rc %d (%s)", rc, ckpt_err_msg());
	/* A decision of an attempt never known, in that place, still ends the begin;
	 * the attempt the BEGIN opened is given up, and its decision is not the next. */
	rc = commit_part_begin(p, 81, &id);
	ck_assert_msg(rc == CKPT_EABORTED && strstr(ckpt_err_msg(), "rank 2 failed"), "rc %d (%s)",
	              rc, ckpt_err_msg());
	rc = commit_part_begin(p, 81, &id);
	ck_assert_msg(rc == 0, "begin after a stale begin: rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_uint_eq(id, NEWER(81));
	commit_part_abort(p, 81, CKPT_EABORTED, "test over");
	/* Voted, then gave up: the attempt's decision stands. */
	ck_assert_int_eq(commit_part_begin(p, 82, &id), 0);
	v.step = 82;
	v.save_id = id;
	ck_assert_int_eq(commit_part_prepare(p, &v), 0);
	commit_part_abort(p, 82, CKPT_EABORTED, "gave up after voting");
	rc = commit_part_wait(p, 82, TMO);
	ck_assert_msg(rc == 0, "a voted attempt's decision: rc %d (%s)", rc, ckpt_err_msg());
	finish(&s, t, p);
}
END_TEST

/* commit_part_decided waits for a decision without giving anything up: none yet is
 * -ETIMEDOUT and changes nothing; one that came is the step's end, with its reason. */
START_TEST(decision_asked_for)
{
	struct script s;
	pthread_t t;
	struct commit_part *p = start_begun(&s, &t, 5, 90);
	uint64_t id;
	int rc = commit_part_decided(p, 90, 50);
	ck_assert_msg(rc == -ETIMEDOUT, "no decision yet: rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_uint_eq(commit_part_attempt(p, 90), ATTEMPT(90));   /* still begun */
	ck_assert_int_eq(commit_part_begin(p, 91, &id), 0);           /* 90's decision is in */
	rc = commit_part_decided(p, 90, TMO);
	ck_assert_msg(rc == CKPT_EABORTED && strstr(ckpt_err_msg(), "aborted by the coordinator: "
	              "rank 2 failed"), "rc %d (%s)", rc, ckpt_err_msg());
	ck_assert_uint_eq(commit_part_attempt(p, 90), 0);             /* over for this rank */
	commit_part_abort(p, 91, CKPT_EABORTED, "test over");
	finish(&s, t, p);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("participant_order");
	TCase *tc = tcase_create("order");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, decision_before_begin_reply);
	tcase_add_test(tc, decision_before_vote);
	tcase_add_test(tc, begin_never_answered);
	tcase_add_test(tc, decision_of_a_given_up_attempt);
	tcase_add_test(tc, decision_asked_for);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
