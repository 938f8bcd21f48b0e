/*
 * test_tree_config.c — which node a rank is on, and whether the hierarchical
 * commit is used (lib/config.c: CKPT_NODE_SIZE, CKPT_LOCAL_RANK /
 * CKPT_LOCAL_WORLD_SIZE / CKPT_NODE_ID, torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE /
 * GROUP_RANK, Slurm's SLURM_LOCALID / SLURM_NODEID / SLURM_NTASKS_PER_NODE /
 * SLURM_TASKS_PER_NODE, CKPT_COMMIT_TREE=off|auto|on), and the leader's local
 * address every rank of a node derives. Each test starts from a clean environment.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"
#include "glue.h"
#include "testutil.h"

static const char *const vars[] = {
	"CKPT_NODE_SIZE", "CKPT_LOCAL_RANK", "CKPT_LOCAL_WORLD_SIZE", "CKPT_NODE_ID",
	"LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_LOCALID", "SLURM_NODEID",
	"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "CKPT_COMMIT_TREE", "RANK",
	"WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
};

static void env_clear(void)
{
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(vars); i++)
		unsetenv(vars[i]);
}

struct node { int rc, first, size, id; bool tree; };

/* Resolve as rank of world with the given NAME=VALUE settings (NULL-ended). */
static struct node resolve(int rank, int world, const char *const *env)
{
	env_clear();
	for (; env && *env; env++) {
		char kv[128];
		snprintf(kv, sizeof kv, "%s", *env);
		char *eq = strchr(kv, '=');
		ck_assert_ptr_nonnull(eq);
		*eq = '\0';
		setenv(kv, eq + 1, 1);
	}
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = "/nonexistent/not-opened";
	o.rank = rank;
	o.world = world;
	o.secret = "tree-config-test-secret";      /* a job of several ranks needs one */
	o.secret_len = strlen(o.secret);
	struct glue_config cfg;
	struct node n = { .rc = config_resolve(&o, &cfg) };
	if (!n.rc) {
		n.first = cfg.node_first;
		n.size = cfg.node_size;
		n.id = cfg.node_id;
		n.tree = cfg.tree;
		config_free(&cfg);
	}
	env_clear();
	return n;
}

#define ENV(...) ((const char *const[]){ __VA_ARGS__, NULL })

static void expect(struct node n, int first, int size, int id, bool tree)
{
	ck_assert_msg(n.rc == 0, "rc %d (%s)", n.rc, ckpt_err_msg());
	ck_assert_int_eq(n.first, first);
	ck_assert_int_eq(n.size, size);
	ck_assert_int_eq(n.id, id);
	ck_assert_int_eq(n.tree, tree);
}

START_TEST(no_launcher_no_leader)
{
	expect(resolve(5, 64, NULL), 5, 1, 5, false);
	/* on, with nothing known of the node: a node of one rank needs no leader. */
	expect(resolve(5, 64, ENV("CKPT_COMMIT_TREE=on")), 5, 1, 5, false);
}
END_TEST

START_TEST(node_size_override)
{
	expect(resolve(13, 64, ENV("CKPT_NODE_SIZE=8")), 8, 8, 1, true);        /* auto: W >= 32 */
	expect(resolve(61, 62, ENV("CKPT_NODE_SIZE=8")), 56, 6, 7, true);       /* the last node */
	expect(resolve(13, 16, ENV("CKPT_NODE_SIZE=4")), 12, 4, 3, false);      /* auto: W < 32 */
	expect(resolve(13, 16, ENV("CKPT_NODE_SIZE=4", "CKPT_COMMIT_TREE=on")), 12, 4, 3, true);
	expect(resolve(13, 64, ENV("CKPT_NODE_SIZE=8", "CKPT_COMMIT_TREE=off")), 8, 8, 1, false);
	/* It overrides what the launcher says. */
	expect(resolve(13, 64, ENV("CKPT_NODE_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2")),
	       8, 8, 1, true);
}
END_TEST

START_TEST(torchrun)
{
	expect(resolve(19, 32, ENV("LOCAL_RANK=3", "LOCAL_WORLD_SIZE=8", "GROUP_RANK=2")),
	       16, 8, 2, true);
	/* One node (what ckpt-synth's forked ranks look like): auto stays flat. */
	expect(resolve(19, 64, ENV("LOCAL_RANK=19", "LOCAL_WORLD_SIZE=64")), 0, 64, 0, false);
	expect(resolve(19, 64, ENV("LOCAL_RANK=19", "LOCAL_WORLD_SIZE=64", "CKPT_COMMIT_TREE=on")),
	       0, 64, 0, true);
	/* LOCAL_RANK alone (an older launcher) says nothing of the node's size. */
	expect(resolve(19, 64, ENV("LOCAL_RANK=3")), 19, 1, 19, false);
	/* CKPT_LOCAL_* override torchrun's. */
	expect(resolve(19, 64, ENV("LOCAL_RANK=3", "LOCAL_WORLD_SIZE=8", "CKPT_LOCAL_RANK=1",
	                           "CKPT_LOCAL_WORLD_SIZE=2", "CKPT_NODE_ID=9")), 18, 2, 9, true);
}
END_TEST

START_TEST(slurm)
{
	expect(resolve(13, 64, ENV("SLURM_LOCALID=5", "SLURM_NODEID=1", "SLURM_NTASKS_PER_NODE=8")),
	       8, 8, 1, true);
	/* Per-node counts: nodes of 4, 4, 2, 2, 2; rank 11 is local 1 of node 3. */
	expect(resolve(11, 14, ENV("SLURM_LOCALID=1", "SLURM_NODEID=3",
	                           "SLURM_TASKS_PER_NODE=4(x2),2(x3)", "CKPT_COMMIT_TREE=on")),
	       10, 2, 3, true);
	expect(resolve(33, 64, ENV("SLURM_LOCALID=1", "SLURM_NODEID=4", "SLURM_TASKS_PER_NODE=8(x8)")),
	       32, 8, 4, true);
	/* Malformed or too short: the node's size is unknown. */
	expect(resolve(33, 64, ENV("SLURM_LOCALID=1", "SLURM_NODEID=9", "SLURM_TASKS_PER_NODE=8(x8)")),
	       33, 1, 33, false);
	expect(resolve(33, 64, ENV("SLURM_LOCALID=1", "SLURM_NODEID=4", "SLURM_TASKS_PER_NODE=8(x")),
	       33, 1, 33, false);
}
END_TEST

START_TEST(bad_values)
{
	/* Launcher values that do not fit: an error where the tree would use them
	 * (on), else ignored (a node of one rank): a context opened with its own rank
	 * and world, or by a tool, does not fail over them. */
	const char *const *bad[] = {
		ENV("LOCAL_RANK=8", "LOCAL_WORLD_SIZE=8"),          /* local rank outside the node */
		ENV("LOCAL_RANK=5", "LOCAL_WORLD_SIZE=8"),          /* rank 3 cannot be local 5 */
		ENV("LOCAL_RANK=0", "LOCAL_WORLD_SIZE=8"),          /* ranks 3..10 outside world 8 */
		ENV("LOCAL_RANK=x", "LOCAL_WORLD_SIZE=8"),
		ENV("SLURM_LOCALID=1", "SLURM_NODEID=0", "SLURM_NTASKS_PER_NODE=-2"),
	};
	for (size_t k = 0; k < CKPT_ARRAY_SIZE(bad); k++) {
		char *with_on[8];
		size_t n = 0;
		for (; bad[k][n]; n++)
			with_on[n] = (char *)bad[k][n];
		with_on[n++] = "CKPT_COMMIT_TREE=on";
		with_on[n] = NULL;
		struct node t = resolve(3, 8, (const char *const *)with_on);
		ck_assert_msg(t.rc == -EINVAL, "case %zu (%s) with tree on: rc %d", k, bad[k][0], t.rc);
		ck_assert_msg(strstr(ckpt_err_msg(), "CKPT_COMMIT_TREE=on"), "%s", ckpt_err_msg());
		expect(resolve(3, 8, bad[k]), 3, 1, 3, false);
	}
	/* Our own variables are always checked. */
	struct node n = resolve(3, 8, ENV("CKPT_COMMIT_TREE=maybe"));
	ck_assert_int_eq(n.rc, -EINVAL);
	n = resolve(3, 8, ENV("CKPT_NODE_SIZE=0"));
	ck_assert_int_eq(n.rc, -EINVAL);
}
END_TEST

START_TEST(leader_address)
{
	char a[108], b[108], c[108], d[108];
	commit_leader_addr(a, sizeof a, "job", 29601, 8);
	commit_leader_addr(b, sizeof b, "job", 29601, 8);
	commit_leader_addr(c, sizeof c, "job", 29601, 16);
	commit_leader_addr(d, sizeof d, "other job", 29601, 8);
	ck_assert_str_eq(a, b);                /* every rank of the node derives the same */
	ck_assert_str_ne(a, c);                /* one per node */
	ck_assert_str_ne(a, d);                /* one per job */
	ck_assert_int_eq(a[0], '@');           /* an abstract socket: no file to leave behind */
	char longjob[300];
	memset(longjob, 'j', sizeof longjob - 1);
	longjob[sizeof longjob - 1] = '\0';
	commit_leader_addr(d, sizeof d, longjob, 65535, 4000000000u);
	ck_assert_uint_lt(strlen(d), 108);     /* fits sun_path whatever the job id */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("commit_tree_config");
	TCase *tc = tcase_create("config");
	tcase_add_test(tc, no_launcher_no_leader);
	tcase_add_test(tc, node_size_override);
	tcase_add_test(tc, torchrun);
	tcase_add_test(tc, slurm);
	tcase_add_test(tc, bad_values);
	tcase_add_test(tc, leader_address);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
