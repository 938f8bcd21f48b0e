/*
 * test_incremental.c — incremental saves (docs/format.md §3b, §8.6a) through the
 * public API: steps where some tensors change and others do not load bit-exact,
 * each unchanged chunk referencing the file that holds its bytes (one hop, never a
 * chain); the switch off (option, environment, one save); retention that removes a
 * step a newer one references keeps the files and the newer step loadable, and GC
 * removes them once nothing references them; a flipped bit or a missing file behind
 * a reference is CKPT_ECORRUPT of the referencing step; and the crash matrix of the
 * retention that removes a referenced step (a crash after the step was retired, and
 * after its files went), each followed by a reopen whose GC must keep every
 * committed step loadable.
 *
 * Data comes from tu_seed() (printed; CKPT_TEST_SEED reproduces a run).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "ckpt_internal.h"
#include "glue.h"             /* hash_whole: steps as builds before format 5 saved them */
#include "io/io.h"
#include "testutil.h"

#define CHUNK  8192u
#define NA     (8 * CHUNK / 4)     /* floats of "a": 8 chunks, changes every step */
#define NB     (8 * CHUNK / 4)     /* floats of "b": 8 chunks, changes at step 3 only */

static char *root;

static void setup(void)
{
	root = tu_tmpdir("incr");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	unsetenv("CKPT_INCREMENTAL");
	unsetenv("CKPT_KEEP_LAST");
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

static ckpt_ctx *open_root(int incremental, uint64_t keep_last)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = CHUNK;
	o.pool_bytes = 16 * CHUNK;
	o.timeout_ms = 10000;
	o.incremental = incremental;
	o.keep_last = keep_last;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open: %s", ckpt_last_error());
	return c;
}

/* The values of step: "a" new at every step; "b" the step-1 values, but its chunk 2
 * from step 3 on; the blob the same at every step. */
static float a_data[NA], b_data[NB];
static char blob[5000];

static void data_of(uint64_t step)
{
	tu_fill(a_data, sizeof a_data, tu_seed(), 100 + step);
	tu_fill(b_data, sizeof b_data, tu_seed(), 1);
	if (step >= 3)
		tu_fill((char *)b_data + 2 * CHUNK, CHUNK, tu_seed(), 3);
	tu_fill(blob, sizeof blob, tu_seed(), 2);
}

/* Save step; off: this save not incremental (ckpt_save_set_incremental). */
static int save_step(ckpt_ctx *c, uint64_t step, bool off)
{
	data_of(step);
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	uint64_t na = NA, nb = NB;
	struct ckpt_tensor a = { .name = "a", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_REPLICATED, .ndim = 1, .global_shape = &na, .data = a_data };
	struct ckpt_tensor b = { .name = "b", .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_F32,
		.policy = CKPT_REPLICATED, .ndim = 1, .global_shape = &nb, .data = b_data };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &a), 0);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &b), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "extra", CKPT_KIND_EXTRA, CKPT_REPLICATED, blob,
	                                    sizeof blob), 0);
	if (off)
		ck_assert_int_eq(ckpt_save_set_incremental(s, 0), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	rc = ckpt_save_wait(s, -1);
	ckpt_save_free(s);
	return rc;
}

/* Step loads bit-exact: every tensor whole, and a slice of "b" (a partial read). */
static void check_step(ckpt_ctx *c, uint64_t step)
{
	static float got_a[NA], got_b[NB];
	static char got_blob[sizeof blob];
	data_of(step);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, step, &l) == 0, "step %llu: %s", (unsigned long long)step,
	              ckpt_last_error());
	ck_assert_msg(ckpt_load_tensor(l, "a", CKPT_F32, 1, NULL, NULL, got_a, CKPT_MEM_HOST) == 0,
	              "%s", ckpt_last_error());
	ck_assert_msg(ckpt_load_tensor(l, "b", CKPT_F32, 1, NULL, NULL, got_b, CKPT_MEM_HOST) == 0,
	              "%s", ckpt_last_error());
	ck_assert(memcmp(got_a, a_data, sizeof got_a) == 0);
	ck_assert(memcmp(got_b, b_data, sizeof got_b) == 0);
	uint64_t off = 3000, ext = 5000;
	memset(got_b, 0, sizeof got_b);
	ck_assert_int_eq(ckpt_load_tensor(l, "b", CKPT_F32, 1, &off, &ext, got_b, CKPT_MEM_HOST), 0);
	ck_assert(memcmp(got_b, b_data + off, ext * 4) == 0);
	size_t len = 0;
	ck_assert_int_eq(ckpt_load_blob(l, "extra", got_blob, sizeof got_blob, &len), 0);
	ck_assert(len == sizeof blob && memcmp(got_blob, blob, len) == 0);
	ckpt_load_close(l);
	struct ckpt_verify_result vr = { .size = sizeof vr };
	struct ckpt_verify_opts vo;
	ckpt_verify_opts_init(&vo, sizeof vo);
	vo.flags = CKPT_VERIFY_NO_MARK;
	ck_assert_msg(ckpt_catalog_verify(c, step, &vo, &vr) == 0, "verify of step %llu: %s",
	              (unsigned long long)step, ckpt_last_error());
}

static void step_info(ckpt_ctx *c, uint64_t step, struct ckpt_step_info *out)
{
	ck_assert_msg(ckpt_step_info(c, step, out, sizeof *out) == 0, "%s", ckpt_last_error());
}

/* The files that hold tensor name's chunks in step, as "F0|F1|...". */
static void chunk_files(ckpt_ctx *c, uint64_t step, const char *name, char *out, size_t cap)
{
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, step, &l), 0);
	int n = ckpt_load_count(l);
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		struct ckpt_tensor_info ti;
		ck_assert_int_eq(ckpt_load_info(l, (unsigned)i, &ti, sizeof ti), 0);
		if (strcmp(ti.name, name))
			continue;
		struct ckpt_chunk_info ch[16];
		int k = ckpt_load_chunks(l, (unsigned)i, ch, 16, sizeof ch[0]);
		ck_assert_int_gt(k, 0);
		size_t used = 0;
		for (int j = 0; j < k && j < 16; j++)
			used += (size_t)snprintf(out + used, cap - used, "%s%s", j ? "|" : "", ch[j].file);
	}
	ckpt_load_close(l);
}

static bool shard_exists(uint64_t step)
{
	char p[4400];
	return tu_shard_path(root, step, 0, p, sizeof p) == 0;
}

/* The one shard file of step (rank 0), as found in its directory. */
static void shard_of(uint64_t step, char *out, size_t cap)
{
	ck_assert_int_eq(tu_shard_path(root, step, 0, out, cap), 0);
}

START_TEST(incr_roundtrip)
{
	ckpt_ctx *c = open_root(1, 0);
	for (uint64_t step = 1; step <= 4; step++)
		ck_assert_msg(save_step(c, step, false) == 0, "step %llu: %s",
		              (unsigned long long)step, ckpt_last_error());
	for (uint64_t step = 1; step <= 4; step++)
		check_step(c, step);
	/* Stored bytes: step 1 all; 2 and 4 "a" only; 3 "a" and one chunk of "b". */
	struct ckpt_step_info si[5];
	for (uint64_t step = 1; step <= 4; step++)
		step_info(c, step, &si[step]);
	uint64_t abytes = NA * 4, bbytes = NB * 4;
	ck_assert_uint_eq(si[1].stored_bytes, abytes + bbytes + sizeof blob);
	ck_assert_uint_eq(si[2].stored_bytes, abytes);
	ck_assert_uint_eq(si[3].stored_bytes, abytes + CHUNK);
	ck_assert_uint_eq(si[4].stored_bytes, abytes);
	ck_assert_uint_eq(si[4].logical_bytes, si[1].logical_bytes);
	/* One hop: step 4's "b" points at step 1's file for its unchanged chunks (never
	 * at step 2 or 3, which reference them too) and at step 3's for chunk 2. */
	char s1[256], s3[256], want[4096], got[4096];
	shard_of(1, s1, sizeof s1);
	shard_of(3, s3, sizeof s3);
	const char *r1 = s1 + strlen(root) + 1, *r3 = s3 + strlen(root) + 1;
	snprintf(want, sizeof want, "%s|%s|%s|%s|%s|%s|%s|%s", r1, r1, r3, r1, r1, r1, r1, r1);
	chunk_files(c, 4, "b", got, sizeof got);
	ck_assert_str_eq(got, want);
	ckpt_close(c);
	/* A fresh context (no state carried in memory) loads them all too. */
	c = open_root(1, 0);
	for (uint64_t step = 1; step <= 4; step++)
		check_step(c, step);
	ckpt_close(c);
}
END_TEST

/* Compressed saves (zstd, bytegroup): an unchanged chunk is referenced in its stored
 * form, whatever its codec, and every step loads bit for bit. */
START_TEST(incr_compressed)
{
	static const int codecs[] = { CKPT_CODEC_ZSTD, CKPT_CODEC_BYTEGROUP };
	for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) {
		struct ckpt_opts o;
		ckpt_opts_init(&o, sizeof o);
		o.root = root;
		o.rank = 0;
		o.world = 1;
		o.chunk_bytes = CHUNK;
		o.pool_bytes = 16 * CHUNK;
		o.timeout_ms = 10000;
		o.incremental = 1;
		o.zstd_level = 1;
		o.compress_codec = codecs[i];
		ckpt_ctx *c = NULL;
		ck_assert_msg(ckpt_open(&o, &c) == 0, "open: %s", ckpt_last_error());
		uint64_t base = 10 * (i + 1);
		/* The first save whole (this codec's chunks to reference), then two more. */
		for (uint64_t step = base + 1; step <= base + 3; step++)
			ck_assert_msg(save_step(c, step, step == base + 1) == 0, "codec %d, step "
			              "%llu: %s", codecs[i], (unsigned long long)step,
			              ckpt_last_error());
		for (uint64_t step = base + 1; step <= base + 3; step++)
			check_step(c, step);
		struct ckpt_step_info a, b;
		step_info(c, base + 1, &a);
		step_info(c, base + 2, &b);
		ck_assert_uint_eq(b.logical_bytes, a.logical_bytes);
		ck_assert_msg(b.stored_bytes < a.stored_bytes, "codec %d: step %llu stored %llu "
		              "bytes, its predecessor %llu: nothing referenced", codecs[i],
		              (unsigned long long)(base + 2), (unsigned long long)b.stored_bytes,
		              (unsigned long long)a.stored_bytes);
		ckpt_close(c);
	}
}
END_TEST

/* A step saved below the latest committed one references nothing (retention or GC
 * may remove its previous step before it commits): written whole, and loads. */
START_TEST(incr_below_latest)
{
	ckpt_ctx *c = open_root(1, 0);
	ck_assert_msg(save_step(c, 10, false) == 0, "%s", ckpt_last_error());
	ck_assert_msg(save_step(c, 20, false) == 0, "%s", ckpt_last_error());
	ck_assert_msg(save_step(c, 15, false) == 0, "%s", ckpt_last_error());
	struct ckpt_step_info s10, s15, s20;
	step_info(c, 10, &s10);
	step_info(c, 15, &s15);
	step_info(c, 20, &s20);
	ck_assert_uint_lt(s20.stored_bytes, s20.logical_bytes);     /* 20 references 10 */
	ck_assert_uint_eq(s15.stored_bytes, s15.logical_bytes);     /* 15 references nothing */
	check_step(c, 15);
	/* Above the latest again: references as before. */
	ck_assert_msg(save_step(c, 30, false) == 0, "%s", ckpt_last_error());
	struct ckpt_step_info s30;
	step_info(c, 30, &s30);
	ck_assert_uint_lt(s30.stored_bytes, s30.logical_bytes);
	check_step(c, 30);
	ckpt_close(c);
}
END_TEST

/* Off by the option, by the environment and by one save: every byte written. */
START_TEST(incr_off)
{
	uint64_t full = NA * 4 + NB * 4 + sizeof blob;
	struct ckpt_step_info si;
	ckpt_ctx *c = open_root(0, 0);
	ck_assert_int_eq(save_step(c, 1, false), 0);
	ck_assert_int_eq(save_step(c, 2, false), 0);
	step_info(c, 2, &si);
	ck_assert_uint_eq(si.stored_bytes, full);
	ckpt_close(c);
	/* The default (no option, no environment) is off. */
	c = open_root(-1, 0);
	ck_assert_int_eq(save_step(c, 3, false), 0);
	step_info(c, 3, &si);
	ck_assert_uint_eq(si.stored_bytes, full);
	ckpt_close(c);
	/* The environment turns it on, and off. */
	setenv("CKPT_INCREMENTAL", "1", 1);
	c = open_root(-1, 0);
	ck_assert_int_eq(save_step(c, 6, false), 0);
	step_info(c, 6, &si);
	ck_assert_uint_eq(si.stored_bytes, NA * 4);
	ckpt_close(c);
	setenv("CKPT_INCREMENTAL", "0", 1);
	c = open_root(-1, 0);
	ck_assert_int_eq(save_step(c, 7, false), 0);
	step_info(c, 7, &si);
	ck_assert_uint_eq(si.stored_bytes, full);
	ckpt_close(c);
	setenv("CKPT_INCREMENTAL", "2", 1);
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	ckpt_ctx *bad = NULL;
	ck_assert_int_eq(ckpt_open(&o, &bad), -EINVAL);
	ck_assert(bad == NULL);
	unsetenv("CKPT_INCREMENTAL");
	c = open_root(1, 0);
	ck_assert_int_eq(save_step(c, 8, true), 0);
	step_info(c, 8, &si);
	ck_assert_uint_eq(si.stored_bytes, full);
	ck_assert_int_eq(save_step(c, 9, false), 0);
	step_info(c, 9, &si);
	ck_assert_uint_eq(si.stored_bytes, NA * 4);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 10, &s), 0);
	ck_assert_int_eq(ckpt_save_set_incremental(s, 7), -EINVAL);
	ckpt_save_free(s);
	for (uint64_t step = 1; step <= 9; step++)
		if (step != 4 && step != 5)
			check_step(c, step);
	ckpt_close(c);
}
END_TEST

/* Retention removes step 1, which step 2 references: step 2 loads, step 1's file
 * stays (its record aborted); once nothing references it, gc removes it. */
START_TEST(incr_retention_keeps_referenced)
{
	ckpt_ctx *c = open_root(1, 1);
	ck_assert_int_eq(save_step(c, 1, false), 0);
	ck_assert_int_eq(save_step(c, 2, false), 0);
	/* Retention runs after the outcome is published: ckpt_close waits for it. */
	ckpt_close(c);
	c = open_root(1, 1);
	struct ckpt_step_info si;
	ck_assert_int_eq(ckpt_step_info(c, 1, &si, sizeof si), 0);
	ck_assert_int_eq(si.state, CKPT_STATE_ABORTED);     /* retired, its file kept */
	ck_assert(shard_exists(1));
	check_step(c, 2);
	/* Step 3 references step 1's file still (through step 2's references, one hop). */
	ck_assert_int_eq(save_step(c, 3, false), 0);
	ckpt_close(c);
	c = open_root(1, 1);
	ck_assert(shard_exists(1));
	ck_assert(!shard_exists(2));          /* step 2's own bytes: "a" only */
	check_step(c, 3);
	/* A full save: nothing references step 1 or 2 any more after retention. */
	ck_assert_int_eq(save_step(c, 4, true), 0);
	ckpt_close(c);
	c = open_root(1, 1);
	ck_assert(!shard_exists(1));
	ck_assert(!shard_exists(2));
	ck_assert(!shard_exists(3));
	check_step(c, 4);
	ckpt_close(c);
}
END_TEST

/* ckpt_catalog_gc by hand: the file goes only when no committed step references it,
 * and a directory without a record that a step references is kept even with
 * CKPT_GC_UNRECORDED. */
START_TEST(incr_gc_by_hand)
{
	ckpt_ctx *c = open_root(1, 0);
	ck_assert_int_eq(save_step(c, 1, false), 0);
	ck_assert_int_eq(save_step(c, 2, false), 0);
	ck_assert_int_eq(save_step(c, 3, true), 0);
	struct ckpt_gc_opts o;
	ckpt_gc_opts_init(&o, sizeof o);
	o.keep_last = 1;
	o.keep_every = 2;            /* keeps step 2, which references step 1 */
	struct ckpt_gc_result res = { .size = sizeof res };
	ck_assert_msg(ckpt_catalog_gc(c, &o, &res) == 0, "%s", ckpt_last_error());
	ck_assert(shard_exists(1));
	check_step(c, 2);
	check_step(c, 3);
	o.keep_every = 0;
	ck_assert_msg(ckpt_catalog_gc(c, &o, &res) == 0, "%s", ckpt_last_error());
	ck_assert(!shard_exists(1));
	ck_assert(!shard_exists(2));
	check_step(c, 3);
	ckpt_close(c);
}
END_TEST

/* A bit flipped in a chunk that step 2 references in step 1's file. */
START_TEST(incr_bitflip_in_referenced)
{
	ckpt_ctx *c = open_root(1, 0);
	ck_assert_int_eq(save_step(c, 1, false), 0);
	ck_assert_int_eq(save_step(c, 2, false), 0);
	char s1[256];
	shard_of(1, s1, sizeof s1);
	/* "b" follows "a" (8 chunks of CHUNK after the 4 KiB header): its chunk 5. */
	ck_assert_int_eq(tu_flip_bit(s1, 4096 + (8 + 5) * CHUNK + 77, 3), 0);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), 0);
	static float got[NB];
	ck_assert_int_eq(ckpt_load_tensor(l, "b", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST),
	                 CKPT_ECORRUPT);
	const char *msg = ckpt_last_error();
	ck_assert_msg(strstr(msg, "step 2") && strstr(msg, s1) && strstr(msg, "referenced by"),
	              "%s", msg);
	/* "a" of step 2 is its own: it loads. */
	static float ga[NA];
	ck_assert_int_eq(ckpt_load_tensor(l, "a", CKPT_F32, 1, NULL, NULL, ga, CKPT_MEM_HOST), 0);
	ckpt_load_close(l);
	struct ckpt_verify_result vr = { .size = sizeof vr };
	ck_assert_int_eq(ckpt_catalog_verify(c, 2, NULL, &vr), CKPT_ECORRUPT);
	msg = ckpt_last_error();
	ck_assert_msg(strstr(msg, "verify of step 2") && strstr(msg, s1), "%s", msg);
	ck_assert_int_eq(vr.bad, 1);
	ck_assert_str_eq(vr.bad_file, s1 + strlen(root) + 1);
	ckpt_close(c);
}
END_TEST

/* The referenced file removed by hand, or replaced by another step's. */
START_TEST(incr_missing_referenced)
{
	ckpt_ctx *c = open_root(1, 0);
	ck_assert_int_eq(save_step(c, 1, false), 0);
	ck_assert_int_eq(save_step(c, 2, false), 0);
	char s1[256], s2[256];
	shard_of(1, s1, sizeof s1);
	shard_of(2, s2, sizeof s2);
	void *p;
	size_t n;
	ck_assert_int_eq(tu_read_file(s2, &p, &n), 0);
	ck_assert_int_eq(tu_write_file(s1, p, n), 0);     /* another file under its name */
	free(p);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), 0);
	static float got[NB];
	ck_assert_int_eq(ckpt_load_tensor(l, "b", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST),
	                 CKPT_ECORRUPT);
	ck_assert_msg(strstr(ckpt_last_error(), "is not the shard of step 1"), "%s",
	              ckpt_last_error());
	ckpt_load_close(l);
	ck_assert_int_eq(unlink(s1), 0);
	ck_assert_int_eq(ckpt_load_open(c, 2, &l), 0);
	ck_assert_int_eq(ckpt_load_tensor(l, "b", CKPT_F32, 1, NULL, NULL, got, CKPT_MEM_HOST),
	                 CKPT_ECORRUPT);
	ck_assert_msg(strstr(ckpt_last_error(), "missing") && strstr(ckpt_last_error(), "step 2"),
	              "%s", ckpt_last_error());
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

/* The crash matrix of references: a job with keep_last 1 saves steps 1..3, killed
 * (CKPT_FAULT crash) at a point of the save of step 2 (before it commits, and
 * after), or of the retention that then removes step 1, which step 2 references.
 * A reopen (whose GC runs) must load every committed step bit-exact, and step 1's
 * file must stay while a committed step references it. */
static const char *crash_points[] = {
	"after_fdatasync:2:crash", "coord_before_commit_txn:2:crash",
	"coord_after_commit_txn:2:crash", "gc_after_retire:1:crash",
	"gc_after_files_removed:1:crash",
};

START_TEST(incr_crash_matrix)
{
	const char *point = crash_points[_i];
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		setenv("CKPT_FAULT", point, 1);
		ckpt_fault_reload();
		ckpt_ctx *c = open_root(1, 1);
		for (uint64_t step = 1; step <= 3; step++)
			if (save_step(c, step, false))
				_exit(1);
		_exit(0);
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 86, "%s: the job was not stopped "
	              "there (status 0x%x)", point, st);
	ckpt_ctx *c = open_root(1, 1);
	uint64_t latest = 0;
	struct ckpt_step_info si;
	for (uint64_t step = 1; step <= 3; step++) {
		if (ckpt_step_info(c, step, &si, sizeof si) == 0 &&
		    si.state == CKPT_STATE_COMMITTED) {
			check_step(c, step);
			latest = step;
		}
	}
	ck_assert_msg(latest >= 1, "%s: no committed step left", point);
	/* The next save works, references what is committed, and every step loads. */
	ck_assert_msg(save_step(c, 4, false) == 0, "%s: %s", point, ckpt_last_error());
	check_step(c, 4);
	ck_assert(shard_exists(1));            /* step 4's "b" lies in step 1's file */
	ckpt_close(c);
}
END_TEST

/* Chunks of several blocks, hashed where they lie: the unchanged ones of a host
 * tensor are found without a copy (the worker's DEBUG line counts them), take the
 * previous step's block hashes into the new table (a partial read and a verify check
 * them), and the hash that decides is taken before the snapshot point: bytes changed
 * right after it are not what the step holds. */
#define BIG_CHUNK  (512u << 10)                           /* two blocks */
#define BIG_BYTES  (4 * BIG_CHUNK + (300u << 10))          /* 4 chunks and a 2-block tail */

struct incr_log {
	pthread_mutex_t lock;
	unsigned long long refs[8], inplace[8];   /* per step, from the worker's line */
};

static void incr_log_fn(void *arg, int level, const struct ckpt_log_ctx *where,
                        const char *msg)
{
	struct incr_log *k = arg;
	unsigned long long step, refs, from, inplace;
	CKPT_UNUSED(level);
	CKPT_UNUSED(where);
	if (sscanf(msg, "step %llu: %llu chunk(s), %*u bytes, referenced from step %llu, %llu",
	           &step, &refs, &from, &inplace) != 4 || step >= 8)
		return;
	pthread_mutex_lock(&k->lock);
	k->refs[step] = refs;
	k->inplace[step] = inplace;
	pthread_mutex_unlock(&k->lock);
}

static int save_big(ckpt_ctx *c, uint64_t step, uint8_t *w, const uint8_t *then)
{
	ckpt_save *s;
	int rc = ckpt_save_begin(c, step, &s);
	if (rc)
		return rc;
	uint64_t n = BIG_BYTES;
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_U8,
		.policy = CKPT_REPLICATED, .ndim = 1, .global_shape = &n, .data = w };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	if (then) {
		/* The caller may change its tensor from the snapshot point on. */
		ck_assert_int_eq(ckpt_save_wait_snapshot(s, -1), 0);
		memcpy(w, then, BIG_BYTES);
	}
	rc = ckpt_save_wait(s, -1);
	ckpt_save_free(s);
	return rc;
}

static void check_big(ckpt_ctx *c, uint64_t step, const uint8_t *want)
{
	static uint8_t got[BIG_BYTES];
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, step, &l), 0);
	ck_assert_msg(ckpt_load_tensor(l, "w", CKPT_U8, 1, NULL, NULL, got, CKPT_MEM_HOST) == 0,
	              "step %llu: %s", (unsigned long long)step, ckpt_last_error());
	ck_assert_msg(memcmp(got, want, BIG_BYTES) == 0, "step %llu differs",
	              (unsigned long long)step);
	/* A slice inside chunk 3's second block: read alone, checked by its block hash. */
	uint64_t off = 3 * BIG_CHUNK + (300u << 10), ext = 1000;
	memset(got, 0, ext);
	ck_assert_int_eq(ckpt_load_tensor(l, "w", CKPT_U8, 1, &off, &ext, got, CKPT_MEM_HOST), 0);
	ck_assert(memcmp(got, want + off, ext) == 0);
	ckpt_load_close(l);
	struct ckpt_verify_result vr = { .size = sizeof vr };
	struct ckpt_verify_opts vo;
	ckpt_verify_opts_init(&vo, sizeof vo);
	vo.flags = CKPT_VERIFY_NO_MARK;
	ck_assert_msg(ckpt_catalog_verify(c, step, &vo, &vr) == 0, "verify of step %llu: %s",
	              (unsigned long long)step, ckpt_last_error());
}

/* An incremental context of BIG_CHUNK chunks whose worker's DEBUG lines go to k. */
static ckpt_ctx *open_big(struct incr_log *k)
{
	memset(&k->refs, 0, sizeof k->refs);
	memset(&k->inplace, 0, sizeof k->inplace);
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.chunk_bytes = BIG_CHUNK;
	o.pool_bytes = 4 * BIG_CHUNK;
	o.timeout_ms = 10000;
	o.incremental = 1;
	o.log_fn = incr_log_fn;
	o.log_arg = k;
	o.log_level = CKPT_LOG_DEBUG;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open: %s", ckpt_last_error());
	return c;
}

START_TEST(incr_inplace)
{
	static uint8_t w[BIG_BYTES], v[4][BIG_BYTES], junk[BIG_BYTES];
	static struct incr_log k = { .lock = PTHREAD_MUTEX_INITIALIZER };
	ckpt_ctx *c = open_big(&k);
	/* v[1]: the step-1 state; v[2]: its chunk 0 changed (the first issued, so every
	 * unchanged chunk comes after it); v[3]: one byte of the tail changed too. */
	tu_fill(v[1], BIG_BYTES, tu_seed(), 40);
	memcpy(v[2], v[1], BIG_BYTES);
	tu_fill(v[2], 1000, tu_seed(), 41);
	memcpy(v[3], v[2], BIG_BYTES);
	v[3][BIG_BYTES - 1] ^= 1;
	tu_fill(junk, BIG_BYTES, tu_seed(), 42);
	struct ckpt_step_info si;
	for (uint64_t step = 1; step <= 3; step++) {
		memcpy(w, v[step], BIG_BYTES);
		ck_assert_msg(save_big(c, step, w, NULL) == 0, "step %llu: %s",
		              (unsigned long long)step, ckpt_last_error());
	}
	step_info(c, 2, &si);
	ck_assert_uint_eq(si.stored_bytes, BIG_CHUNK);
	step_info(c, 3, &si);
	ck_assert_uint_eq(si.stored_bytes, 300u << 10);
	pthread_mutex_lock(&k.lock);
	ck_assert_uint_eq(k.refs[2], 4);         /* chunks 1-3 and the tail */
	ck_assert_uint_eq(k.inplace[2], 4);
	ck_assert_uint_eq(k.refs[3], 4);         /* chunks 0-3 */
	ck_assert_uint_ge(k.inplace[3], 3);      /* the first issued may be copied first */
	pthread_mutex_unlock(&k.lock);
	/* Step 4 holds v[3], the state at its snapshot point, though junk replaced it
	 * right after: the hashes that chose the references were of v[3]'s bytes. */
	memcpy(w, v[3], BIG_BYTES);
	ck_assert_msg(save_big(c, 4, w, junk) == 0, "step 4: %s", ckpt_last_error());
	ckpt_close(c);
	c = open_root(1, 0);
	check_big(c, 1, v[1]);
	check_big(c, 2, v[2]);
	check_big(c, 3, v[3]);
	check_big(c, 4, v[3]);
	ckpt_close(c);
}
END_TEST

/* The format version in the header of step's shard file (rank 0). */
static uint32_t shard_version(uint64_t step)
{
	char p[4400];
	shard_of(step, p, sizeof p);
	void *b;
	size_t n;
	ck_assert_int_eq(tu_read_file(p, &b, &n), 0);
	ck_assert_uint_ge(n, 12);
	uint32_t v = (uint32_t)((uint8_t *)b)[8] | (uint32_t)((uint8_t *)b)[9] << 8 |
	             (uint32_t)((uint8_t *)b)[10] << 16 | (uint32_t)((uint8_t *)b)[11] << 24;
	free(b);
	return v;
}

/* Every chunk of "w" in step: its hash taken over blocks of hash_blocks bytes (0: over
 * its bytes), as ckpt_load_chunks reports it. */
static void check_hash_blocks(ckpt_ctx *c, uint64_t step, uint32_t want)
{
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, step, &l), 0);
	struct ckpt_chunk_info ch[8];
	int n = ckpt_load_chunks(l, 0, ch, 8, sizeof ch[0]);
	ck_assert_int_eq(n, 5);
	for (int k = 0; k < n; k++)
		ck_assert_msg(ch[k].hash_blocks == want, "step %llu chunk %d: hash over blocks of %u "
		              "bytes, not %u", (unsigned long long)step, k, ch[k].hash_blocks, want);
	ckpt_load_close(l);
}

/* Step of a blob "x" and a rank-bound tensor "r", each one chunk of two blocks. */
static void save_blob_and_own(ckpt_ctx *c, uint64_t step, const uint8_t *x, uint8_t *r)
{
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, step, &s), 0);
	uint64_t n = BIG_CHUNK;
	struct ckpt_tensor t = { .name = "r", .kind = CKPT_KIND_OPTIMIZER, .dtype = CKPT_U8,
		.policy = CKPT_RANK_BOUND, .ndim = 1, .global_shape = &n, .data = r };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, "x", CKPT_KIND_EXTRA, CKPT_REPLICATED, x,
	                                    BIG_CHUNK), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "step %llu: %s", (unsigned long long)step,
	              ckpt_last_error());
	ckpt_save_free(s);
}

/* `ckpt-inspect ROOT diff A B`: its last line, "N added, N removed, N changed, N
 * unchanged". */
static void inspect_diff(uint64_t a, uint64_t b, char *out, size_t cap)
{
	const char *tool = getenv("CKPT_TEST_INSPECT");
	ck_assert_msg(tool && *tool, "CKPT_TEST_INSPECT (the ckpt-inspect binary) is not set");
	char cmd[8192];
	snprintf(cmd, sizeof cmd, "'%s' '%s' diff %llu %llu", tool, root, (unsigned long long)a,
	         (unsigned long long)b);
	FILE *f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	char line[512];
	out[0] = '\0';
	while (fgets(line, sizeof line, f))
		snprintf(out, cap, "%s", line);
	ck_assert_int_eq(pclose(f), 0);
	out[strcspn(out, "\n")] = '\0';
}

/*
 * Steps of format 3 (hashes of whole chunks), then a build that writes format 5
 * (chunk hashes over block hashes, docs/format.md §5). Its first incremental save
 * finds none of the older step's chunks of several blocks, whose hashes are of the
 * other kind, and saves them all again; the next references it. Every step loads and verifies, ckpt_load_chunks
 * says how each chunk's hash was taken, and ckpt-inspect diff finds the same bytes
 * unchanged across the two formats (it reads them: a tensor's box, a blob, a rank's
 * own tensor) and a changed byte changed.
 */
START_TEST(incr_upgrade_to_tree_hashes)
{
	static uint8_t w[BIG_BYTES], v[BIG_BYTES];
	static struct incr_log k = { .lock = PTHREAD_MUTEX_INITIALIZER };
	ckpt_ctx *c = open_big(&k);
	tu_fill(w, BIG_BYTES, tu_seed(), 60);
	memcpy(v, w, BIG_BYTES);
	v[BIG_CHUNK + 5] ^= 0x10;               /* chunk 1 changed */
	c->hash_whole = true;                   /* as builds before format 5 saved */
	ck_assert_msg(save_big(c, 1, w, NULL) == 0, "step 1: %s", ckpt_last_error());
	c->hash_whole = false;
	ck_assert_msg(save_big(c, 2, w, NULL) == 0, "step 2: %s", ckpt_last_error());
	ck_assert_msg(save_big(c, 3, v, NULL) == 0, "step 3: %s", ckpt_last_error());
	ck_assert_msg(save_big(c, 4, v, NULL) == 0, "step 4: %s", ckpt_last_error());
	ck_assert_uint_eq(shard_version(1), 3);
	ck_assert_uint_eq(shard_version(2), 5);
	ck_assert_uint_eq(shard_version(3), 5);
	struct ckpt_step_info si;
	step_info(c, 2, &si);
	ck_assert_uint_eq(si.stored_bytes, BIG_BYTES);   /* nothing referenced from step 1 */
	step_info(c, 3, &si);
	ck_assert_uint_eq(si.stored_bytes, BIG_CHUNK);   /* all but chunk 1 from step 2 */
	step_info(c, 4, &si);
	ck_assert_uint_eq(si.stored_bytes, 0);
	pthread_mutex_lock(&k.lock);
	ck_assert_uint_eq(k.refs[2], 0);
	ck_assert_uint_eq(k.refs[3], 4);
	ck_assert_uint_eq(k.refs[4], 5);
	pthread_mutex_unlock(&k.lock);
	ckpt_close(c);
	c = open_root(1, 0);
	check_big(c, 1, w);
	check_big(c, 2, w);
	check_big(c, 3, v);
	check_big(c, 4, v);
	check_hash_blocks(c, 1, 0);
	check_hash_blocks(c, 2, IO_BLOCK_BYTES);
	check_hash_blocks(c, 4, IO_BLOCK_BYTES);
	ckpt_close(c);
	char got[512];
	inspect_diff(1, 2, got, sizeof got);
	ck_assert_str_eq(got, "0 added, 0 removed, 0 changed, 1 unchanged");
	inspect_diff(1, 3, got, sizeof got);
	ck_assert_str_eq(got, "0 added, 0 removed, 1 changed, 0 unchanged");
	inspect_diff(3, 4, got, sizeof got);
	ck_assert_str_eq(got, "0 added, 0 removed, 0 changed, 1 unchanged");
	/* diff's other two ways of reading a box: a blob, and a rank's own tensor. */
	static uint8_t x[BIG_CHUNK], r[BIG_CHUNK];
	tu_fill(x, sizeof x, tu_seed(), 61);
	tu_fill(r, sizeof r, tu_seed(), 62);
	c = open_big(&k);
	c->hash_whole = true;
	save_blob_and_own(c, 5, x, r);
	c->hash_whole = false;
	save_blob_and_own(c, 6, x, r);
	x[sizeof x - 1] ^= 1;
	save_blob_and_own(c, 7, x, r);
	ckpt_close(c);
	inspect_diff(5, 6, got, sizeof got);
	ck_assert_str_eq(got, "0 added, 0 removed, 0 changed, 2 unchanged");
	inspect_diff(5, 7, got, sizeof got);
	ck_assert_str_eq(got, "0 added, 0 removed, 1 changed, 1 unchanged");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("incremental");
	TCase *tc = tcase_create("incremental");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, incr_roundtrip);
	tcase_add_test(tc, incr_off);
	tcase_add_test(tc, incr_retention_keeps_referenced);
	tcase_add_test(tc, incr_gc_by_hand);
	tcase_add_test(tc, incr_bitflip_in_referenced);
	tcase_add_test(tc, incr_missing_referenced);
	tcase_add_test(tc, incr_inplace);
	tcase_add_test(tc, incr_upgrade_to_tree_hashes);
	tcase_add_test(tc, incr_compressed);
	tcase_add_test(tc, incr_below_latest);
	tcase_add_loop_test(tc, incr_crash_matrix, 0, (int)(sizeof crash_points /
	                                                    sizeof crash_points[0]));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	printf("seed %llu\n", (unsigned long long)tu_seed());
	SRunner *sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
