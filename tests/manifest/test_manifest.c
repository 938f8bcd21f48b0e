/*
 * test_manifest.c — lib/manifest: open/create rules, the commit and its refusals,
 * readers, ordering of big-endian keys, aborted steps, trust, delete, corrupt and
 * foreign records (raw LMDB writes), map growth, threads and durability.
 *
 * Data is generated from tu_seed() (printed; CKPT_TEST_SEED reproduces a run).
 */
#include <check.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "manifest/manifest.h"
#include "manifest/manifest_internal.h"
#include "testutil.h"

/* manifest_open_map on root's own manifest directory. */
static int open_map(const char *root, unsigned flags, size_t map_bytes, struct manifest **m)
{
	char dir[4096];
	ck_assert_int_eq(ckpt_path_manifest_dir(dir, sizeof dir, root), 0);
	return manifest_open_map(dir, flags, map_bytes, m);
}

/* ------------------------------------------------------------------ generated data */

/* An aborted attempt's record of (step, world), for manifest_record_abort. */
#define AREC(step_, world_) (&(struct manifest_step){ .step = (step_), .world = (world_) })

/* Index length of (step, rank): varied, never 0; fixed_len overrides. */
static size_t gen_index_len(uint64_t step, uint32_t rank, size_t fixed_len)
{
	if (fixed_len)
		return fixed_len;
	uint64_t s = tu_seed() ^ (step * 31 + rank);
	return 1 + (size_t)(tu_rand(&s) % 5000);
}

static uint64_t gen_stream(uint64_t step, uint32_t rank) { return step * 100003u + rank; }

/* A full set of shard records for one step, with their backing memory. */
struct shardset {
	uint32_t               w;
	struct manifest_shard *sh;
	char                 (*paths)[64];
};

static void shardset_make(struct shardset *ss, uint64_t step, uint32_t w, size_t fixed_len)
{
	ss->w = w;
	ss->sh = calloc(w, sizeof *ss->sh);
	ss->paths = calloc(w, sizeof *ss->paths);
	ck_assert(ss->sh && ss->paths);
	for (uint32_t r = 0; r < w; r++) {
		struct manifest_shard *s = &ss->sh[r];
		s->rank = r;
		ck_assert_int_eq(ckpt_path_shard_rel(ss->paths[r], sizeof ss->paths[r], step, r, 0), 0);
		s->path = ss->paths[r];
		s->file_size = step * 7 + r + 4096;
		tu_fill(s->footer_hash, CKPT_HASH_BYTES, tu_seed(), gen_stream(step, r) ^ 0xF00Du);
		s->index_len = gen_index_len(step, r, fixed_len);
		void *ix = malloc(s->index_len);
		ck_assert(ix);
		tu_fill(ix, s->index_len, tu_seed(), gen_stream(step, r));
		s->index = ix;
	}
}

static void shardset_free(struct shardset *ss)
{
	for (uint32_t r = 0; r < ss->w; r++)
		free((void *)ss->sh[r].index);
	free(ss->sh);
	free(ss->paths);
}

/* Shuffle the order in which shards are handed to commit. */
static void shardset_shuffle(struct shardset *ss, uint64_t *rng)
{
	for (uint32_t i = ss->w; i > 1; i--) {
		uint32_t j = (uint32_t)(tu_rand(rng) % i);
		struct manifest_shard t = ss->sh[i - 1];
		ss->sh[i - 1] = ss->sh[j];
		ss->sh[j] = t;
	}
}

static struct manifest_step gen_step(uint64_t step, uint32_t w)
{
	struct manifest_step r;
	memset(&r, 0, sizeof r);
	r.step = step;
	r.world = w;
	r.ntensors = w * 3 + 1;
	r.logical_bytes = step * 100 + 1;
	r.stored_bytes = step * 50 + 2;
	snprintf(r.job_id, sizeof r.job_id, "job-%llu", (unsigned long long)step);
	return r;
}

/* Commit (step, w) with generated data; returns manifest_commit's result. */
static int commit_gen(struct manifest *m, uint64_t step, uint32_t w, size_t fixed_len)
{
	struct shardset ss;
	shardset_make(&ss, step, w, fixed_len);
	uint64_t rng = tu_seed() ^ step;
	shardset_shuffle(&ss, &rng);
	struct manifest_step r = gen_step(step, w);
	int rc = manifest_commit(m, &r, ss.sh, w);
	shardset_free(&ss);
	return rc;
}

/* Verify one shard record against the generated data: 0, or a distinct
 * positive number saying what differs (usable from threads: no ck_assert). */
static int shard_verify(struct manifest *m, uint64_t step, uint32_t rank, size_t fixed_len)
{
	struct manifest_shard s;
	int rc = manifest_shard_get(m, step, rank, &s);
	if (rc)
		return rc;
	char path[64];
	uint8_t hash[CKPT_HASH_BYTES];
	ckpt_path_shard_rel(path, sizeof path, step, rank, 0);
	tu_fill(hash, sizeof hash, tu_seed(), gen_stream(step, rank) ^ 0xF00Du);
	size_t len = gen_index_len(step, rank, fixed_len);
	int bad = 0;
	if (s.rank != rank)
		bad = 1;
	else if (strcmp(s.path, path) != 0)
		bad = 2;
	else if (s.file_size != step * 7 + rank + 4096)
		bad = 3;
	else if (memcmp(s.footer_hash, hash, sizeof hash) != 0)
		bad = 4;
	else if (s.index_len != len)
		bad = 5;
	else {
		uint8_t *want = malloc(len);
		tu_fill(want, len, tu_seed(), gen_stream(step, rank));
		if (memcmp(s.index, want, len) != 0)
			bad = 6;
		free(want);
	}
	manifest_shard_free(&s);
	if (s.owned_ || s.index || s.path)
		bad = 7;
	return bad;
}

static void step_verify(struct manifest *m, uint64_t step, uint32_t w, size_t fixed_len)
{
	struct manifest_step got, want = gen_step(step, w);
	ck_assert_int_eq(manifest_step_get(m, step, &got), 0);
	ck_assert_uint_eq(got.step, step);
	ck_assert_uint_eq(got.state, CKPT_STATE_COMMITTED);
	ck_assert_uint_eq(got.trust, CKPT_TRUST_COMMITTED);
	ck_assert_uint_eq(got.world, w);
	ck_assert_uint_eq(got.ntensors, want.ntensors);
	ck_assert_uint_eq(got.logical_bytes, want.logical_bytes);
	ck_assert_uint_eq(got.stored_bytes, want.stored_bytes);
	ck_assert_uint_ne(got.commit_time_ns, 0);
	ck_assert_str_eq(got.job_id, want.job_id);
	for (uint32_t r = 0; r < w; r++)
		ck_assert_int_eq(shard_verify(m, step, r, fixed_len), 0);
	struct manifest_shard s;
	ck_assert_int_eq(manifest_shard_get(m, step, w, &s), CKPT_ENOTFOUND);
	ck_assert_ptr_null(s.owned_);
}

static struct manifest *open_create(const char *root)
{
	struct manifest *m = NULL;
	int rc = manifest_open(root, MANIFEST_CREATE, &m);
	ck_assert_msg(rc == 0, "open %s: %d %s", root, rc, ckpt_err_msg());
	return m;
}

/* Entries in a database of m, through LMDB directly. */
static size_t db_entries(struct manifest *m, MDB_dbi dbi)
{
	MDB_txn *txn;
	MDB_stat st;
	ck_assert_int_eq(mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn), 0);
	ck_assert_int_eq(mdb_stat(txn, dbi, &st), 0);
	mdb_txn_abort(txn);
	return st.ms_entries;
}

/* Put raw bytes under a key in db ("meta", "steps", "shards") of root's manifest,
 * with the manifest closed (one process must not open an env twice). */
static void raw_put(const char *root, const char *db, const void *key, size_t klen,
                    const void *val, size_t vlen)
{
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/manifest", root);
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	ck_assert_int_eq(mdb_env_create(&env), 0);
	ck_assert_int_eq(mdb_env_set_maxdbs(env, 4), 0);
	ck_assert_int_eq(mdb_env_open(env, dir, 0, 0644), 0);
	ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
	ck_assert_int_eq(mdb_dbi_open(txn, db, 0, &dbi), 0);
	MDB_val k = { klen, (void *)key }, v = { vlen, (void *)val };
	ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
	ck_assert_int_eq(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

/* The same through an open manifest's environment (for the fuzz replay). */
static void m_put(struct manifest *m, MDB_dbi dbi, const void *key, size_t klen,
                  const void *val, size_t vlen)
{
	MDB_txn *txn;
	ck_assert_int_eq(mdb_txn_begin(m->env, NULL, 0, &txn), 0);
	MDB_val k = { klen, (void *)key }, v = { vlen, (void *)val };
	ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
	ck_assert_int_eq(mdb_txn_commit(txn), 0);
}

/* ------------------------------------------------------------------ open */

START_TEST(create_open_reopen)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = (struct manifest *)1;
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), -ENOENT);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), root));
	ck_assert_int_eq(manifest_open(root, 0, &m), -ENOENT);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY | MANIFEST_CREATE, &m), -EINVAL);

	m = open_create(root);
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(m, &latest), CKPT_ENOTFOUND);
	ck_assert_int_eq(manifest_steps_list(m, true, NULL, 0), 0);
	ck_assert_int_eq(commit_gen(m, 3, 2, 0), 0);
	manifest_close(m);
	manifest_close(NULL);

	/* Reopen read-write without CREATE, then read-only; CREATE again is harmless. */
	ck_assert_int_eq(manifest_open(root, 0, &m), 0);
	step_verify(m, 3, 2, 0);
	manifest_close(m);
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), 0);
	step_verify(m, 3, 2, 0);
	manifest_close(m);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	step_verify(m, 3, 2, 0);
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 3);
	/* A read-only handle refuses every write. */
	ck_assert_int_eq(commit_gen(m, 4, 1, 0), CKPT_ESTATE);
	ck_assert_int_eq(manifest_record_abort(m, AREC(4, 1), "x"), CKPT_ESTATE);
	ck_assert_int_eq(manifest_set_trust(m, 3, CKPT_TRUST_VERIFIED), CKPT_ESTATE);
	ck_assert_int_eq(manifest_step_delete(m, 3), CKPT_ESTATE);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(open_missing_root)
{
	char *base = tu_tmpdir("manifest");
	char root[4096];
	snprintf(root, sizeof root, "%s/does-not-exist", base);
	struct manifest *m = (struct manifest *)1;
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), -ENOENT);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), root));
	/* CREATE makes <root>/manifest, not the root itself. */
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), -ENOENT);
	ck_assert_ptr_null(m);
	tu_rmtree(base);
	free(base);
}
END_TEST

START_TEST(open_not_a_manifest)
{
	char *root = tu_tmpdir("manifest");
	char p[4096];
	struct manifest *m = (struct manifest *)1;

	/* "manifest" is a regular file: no usable manifest. */
	snprintf(p, sizeof p, "%s/manifest", root);
	ck_assert_int_eq(tu_write_file(p, "hello", 5), 0);
	ck_assert_int_eq(manifest_open(root, 0, &m), CKPT_ENOMANIFEST);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), root));
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), CKPT_ENOMANIFEST);
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), CKPT_ENOMANIFEST);
	ck_assert_int_eq(unlink(p), 0);

	/* A directory without data.mdb: not a manifest, and CREATE will not adopt it
	 * when it holds something else. */
	ck_assert_int_eq(mkdir(p, 0755), 0);
	ck_assert_int_eq(manifest_open(root, 0, &m), CKPT_ENOMANIFEST);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), CKPT_ENOMANIFEST);
	snprintf(p, sizeof p, "%s/manifest/notes.txt", root);
	ck_assert_int_eq(tu_write_file(p, "x", 1), 0);
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), CKPT_ENOMANIFEST);
	ck_assert_int_eq(unlink(p), 0);

	/* data.mdb of garbage: refused before LMDB maps it, and never initialised. */
	snprintf(p, sizeof p, "%s/manifest/data.mdb", root);
	char junk[16384];
	memset(junk, 0x5a, sizeof junk);
	ck_assert_int_eq(tu_write_file(p, junk, sizeof junk), 0);
	ck_assert_int_eq(manifest_open(root, 0, &m), CKPT_ENOMANIFEST);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), CKPT_ENOMANIFEST);
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), CKPT_ENOMANIFEST);
	ck_assert_ptr_null(m);
	struct stat st;
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_int_eq(st.st_size, (off_t)sizeof junk);
	ck_assert_int_eq(unlink(p), 0);

	/* A root that is a regular file. */
	snprintf(p, sizeof p, "%s/plainfile", root);
	ck_assert_int_eq(tu_write_file(p, "x", 1), 0);
	ck_assert_int_eq(manifest_open(p, MANIFEST_CREATE, &m), CKPT_ENOTROOT);
	ck_assert_int_eq(manifest_open(p, MANIFEST_RDONLY, &m), CKPT_ENOTROOT);
	ck_assert_int_eq(unlink(p), 0);

	/* An empty directory is adopted by CREATE. */
	snprintf(p, sizeof p, "%s/manifest/lock.mdb", root);
	unlink(p);
	m = open_create(root);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(format_version_newer)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 1, 1, 0), 0);
	manifest_close(m);

	uint8_t v[4];
	ckpt_put_le32(v, MANIFEST_FORMAT_VERSION + 1);
	raw_put(root, "meta", "format", 6, v, sizeof v);
	m = (struct manifest *)1;
	ck_assert_int_eq(manifest_open(root, 0, &m), CKPT_EVERSION);
	ck_assert_ptr_null(m);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), root));
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), CKPT_EVERSION);
	ck_assert_int_eq(manifest_open(root, MANIFEST_CREATE, &m), CKPT_EVERSION);

	raw_put(root, "meta", "format", 6, v, 3);            /* wrong size */
	ck_assert_int_eq(manifest_open(root, 0, &m), CKPT_ENOMANIFEST);

	ckpt_put_le32(v, MANIFEST_FORMAT_VERSION);           /* and back: data intact */
	raw_put(root, "meta", "format", 6, v, sizeof v);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	step_verify(m, 1, 1, 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ commit */

START_TEST(commit_read_back)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 100, 1, 0), 0);
	ck_assert_int_eq(commit_gen(m, 200, 7, 0), 0);
	step_verify(m, 100, 1, 0);
	step_verify(m, 200, 7, 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 8);

	/* commit_time_ns given by the caller is kept; trust given is kept. */
	struct shardset ss;
	shardset_make(&ss, 300, 2, 0);
	struct manifest_step r = gen_step(300, 2), got;
	r.commit_time_ns = 123456789;
	r.trust = CKPT_TRUST_VERIFIED;
	r.job_id[0] = '\0';
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 2), 0);
	shardset_free(&ss);
	ck_assert_int_eq(manifest_step_get(m, 300, &got), 0);
	ck_assert_uint_eq(got.commit_time_ns, 123456789);
	ck_assert_uint_eq(got.trust, CKPT_TRUST_VERIFIED);
	ck_assert_str_eq(got.job_id, "");
	manifest_close(m);

	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	step_verify(m, 100, 1, 0);
	step_verify(m, 200, 7, 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(commit_twice_eexist)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 5, 3, 0), 0);

	/* A second commit with different content changes nothing. */
	struct shardset ss;
	shardset_make(&ss, 5, 2, 77);
	struct manifest_step r = gen_step(5, 2);
	r.ntensors = 999;
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 2), -EEXIST);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "step 5"));
	shardset_free(&ss);
	ck_assert_int_eq(commit_gen(m, 5, 3, 0), -EEXIST);
	step_verify(m, 5, 3, 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 3);
	ck_assert_uint_eq(db_entries(m, m->dbi_steps), 1);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(commit_bad_shards_einval)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	struct shardset ss;
	shardset_make(&ss, 9, 4, 0);
	struct manifest_step r = gen_step(9, 4);

	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 3), -EINVAL);      /* a rank missing */
	ss.sh[3].rank = 1;                                                /* duplicate */
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), -EINVAL);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "rank 1"));
	ss.sh[3].rank = 4;                                                /* out of range */
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), -EINVAL);
	ss.sh[3].rank = UINT32_MAX;
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), -EINVAL);
	ss.sh[3].rank = 3;
	struct manifest_step r0 = gen_step(9, 0);                          /* world 0 */
	ck_assert_int_eq(manifest_commit(m, &r0, ss.sh, 0), -EINVAL);

	const char *bad_paths[] = { "", "/abs/rank.shard", "../escape.shard", "a/../b", "a//b",
	                            "./a", NULL };
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bad_paths); i++) {
		ss.sh[2].path = bad_paths[i];
		ck_assert_msg(manifest_commit(m, &r, ss.sh, 4) == -EINVAL, "path %zu", i);
	}
	char longpath[MANIFEST_MAX_PATH + 2];
	memset(longpath, 'p', sizeof longpath - 1);
	longpath[sizeof longpath - 1] = '\0';
	ss.sh[2].path = longpath;
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), -EINVAL);
	ss.sh[2].path = ss.paths[2];

	size_t keep = ss.sh[1].index_len;
	ss.sh[1].index_len = 0;                                           /* empty index */
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), -EINVAL);
	ss.sh[1].index_len = keep;

	memset(r.job_id, 'j', sizeof r.job_id);                           /* unterminated job id */
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), -EINVAL);
	r = gen_step(9, 4);

	/* Nothing of any refused commit is stored; the good one then works. */
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_steps), 0);
	struct manifest_step got;
	ck_assert_int_eq(manifest_step_get(m, 9, &got), CKPT_ENOTFOUND);
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 4), 0);
	shardset_free(&ss);
	step_verify(m, 9, 4, 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ readers */

START_TEST(order_and_latest)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	uint64_t steps[] = { UINT64_MAX - 1, 256, 0, 1ull << 32, UINT64_MAX, 255, 1,
	                     (1ull << 63) + 5, 65536, (1ull << 63) - 1 };
	size_t n = CKPT_ARRAY_SIZE(steps);
	uint64_t latest;
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(commit_gen(m, steps[i], 1 + (uint32_t)(i % 3), 0), 0);
		uint64_t want = 0;
		for (size_t j = 0; j <= i; j++)
			want = steps[j] > want ? steps[j] : want;
		ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
		ck_assert_uint_eq(latest, want);
	}
	uint64_t got[16];
	ck_assert_int_eq(manifest_steps_list(m, false, got, CKPT_ARRAY_SIZE(got)), (int)n);
	for (size_t i = 1; i < n; i++)
		ck_assert_msg(got[i - 1] < got[i], "not ascending at %zu", i);
	ck_assert_uint_eq(got[0], 0);
	ck_assert_uint_eq(got[n - 1], UINT64_MAX);
	/* cap smaller than the count: fills cap, returns the count. */
	uint64_t few[3] = { 7, 7, 7 };
	ck_assert_int_eq(manifest_steps_list(m, false, few, 2), (int)n);
	ck_assert_uint_eq(few[0], 0);
	ck_assert_uint_eq(few[1], 1);
	ck_assert_uint_eq(few[2], 7);
	for (size_t i = 0; i < n; i++)
		step_verify(m, steps[i], 1 + (uint32_t)(i % 3), 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(aborted_steps)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 1, 2, 0), 0);
	ck_assert_int_eq(commit_gen(m, 3, 2, 0), 0);
	ck_assert_int_eq(manifest_record_abort(m, AREC(2, 2), "rank 1 timed out"), 0);
	ck_assert_int_eq(manifest_record_abort(m, AREC(4, 2), NULL), 0);
	ck_assert_int_eq(manifest_record_abort(m, AREC(4, 3), "again"), 0);      /* replaces */

	uint64_t latest, got[8];
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 3);
	ck_assert_int_eq(manifest_steps_list(m, false, got, 8), 2);
	ck_assert_uint_eq(got[0], 1);
	ck_assert_uint_eq(got[1], 3);
	ck_assert_int_eq(manifest_steps_list(m, true, got, 8), 4);
	for (int i = 0; i < 4; i++)
		ck_assert_uint_eq(got[i], (uint64_t)i + 1);
	struct manifest_step r;
	ck_assert_int_eq(manifest_step_get(m, 4, &r), 0);
	ck_assert_uint_eq(r.state, CKPT_STATE_ABORTED);
	ck_assert_uint_eq(r.world, 3);
	struct manifest_shard s;
	ck_assert_int_eq(manifest_shard_get(m, 4, 0, &s), CKPT_ENOTFOUND);

	/* A committed step is never turned into an aborted one. */
	ck_assert_int_eq(manifest_record_abort(m, AREC(3, 2), "late"), -EEXIST);
	step_verify(m, 3, 2, 0);

	/* A later commit of an aborted step works and makes it the latest. */
	ck_assert_int_eq(commit_gen(m, 4, 5, 0), 0);
	step_verify(m, 4, 5, 0);
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 4);
	ck_assert_int_eq(manifest_steps_list(m, false, got, 8), 3);
	/* And an abort above every commit leaves latest alone. */
	ck_assert_int_eq(manifest_record_abort(m, AREC(UINT64_MAX, 1), "x"), 0);
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 4);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* A record's checksum as the codec computes it (rec_check). */
static uint64_t test_rec_check(uint64_t step, const void *val, size_t vlen)
{
	uint8_t k[MANIFEST_STEP_KEY_BYTES];
	manifest_step_key(k, step);
	return XXH3_64bits_withSeed(val, vlen, XXH3_64bits(k, sizeof k));
}

/* The user's metadata: stored with the committed record (version 3), read back
 * exactly, kept when the trust changes; a record without it stays version 2; a
 * hostile length or a NUL inside is CKPT_EFORMAT, never a read past the value. */
START_TEST(step_meta)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	uint64_t rng = tu_seed() ^ 0x3E7A;
	/* Metadata of random length and bytes (no NUL: the codec does not check JSON). */
	uint32_t ml = 1 + (uint32_t)(tu_rand(&rng) % 3000);
	char *meta = malloc(ml + 1);
	for (uint32_t i = 0; i < ml; i++)
		meta[i] = (char)(' ' + tu_rand(&rng) % 95);
	meta[ml] = '\0';

	struct shardset ss;
	shardset_make(&ss, 7, 2, 0);
	struct manifest_step r = gen_step(7, 2), got;
	r.meta = meta;
	r.meta_len = ml;
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 2), 0);
	shardset_free(&ss);
	ck_assert_int_eq(commit_gen(m, 8, 1, 0), 0);            /* no metadata */

	char *buf = malloc(MANIFEST_MAX_META);
	size_t len = 0;
	ck_assert_int_eq(manifest_step_meta(m, 7, buf, MANIFEST_MAX_META, &len), 0);
	ck_assert_uint_eq(len, ml);
	ck_assert_mem_eq(buf, meta, ml);
	len = 0;
	ck_assert_int_eq(manifest_step_meta(m, 7, buf, ml, &len), 0);   /* exactly fits */
	ck_assert_uint_eq(len, ml);
	len = 0;
	ck_assert_int_eq(manifest_step_meta(m, 7, buf, ml - 1, &len), -ENOSPC);
	ck_assert_uint_eq(len, ml);
	ck_assert_int_eq(manifest_step_meta(m, 8, buf, 16, &len), 0);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(manifest_step_meta(m, 9, buf, 16, &len), CKPT_ENOTFOUND);
	/* The other readers say how much there is and point nowhere. */
	ck_assert_int_eq(manifest_step_get(m, 7, &got), 0);
	ck_assert_uint_eq(got.meta_len, ml);
	ck_assert_ptr_null(got.meta);
	step_verify(m, 8, 1, 0);

	/* Verify (trust) rewrites the record: the metadata stays. */
	ck_assert_int_eq(manifest_set_trust(m, 7, CKPT_TRUST_VERIFIED), 0);
	ck_assert_int_eq(manifest_step_meta(m, 7, buf, MANIFEST_MAX_META, &len), 0);
	ck_assert_uint_eq(len, ml);
	ck_assert_mem_eq(buf, meta, ml);
	manifest_close(m);

	/* Record versions: 3 with metadata, 2 without (what older builds read). */
	r.state = CKPT_STATE_COMMITTED;
	r.trust = CKPT_TRUST_COMMITTED;
	size_t n = manifest_step_encode(&r, NULL, NULL);
	uint8_t *v = malloc(n + 16);
	ck_assert_uint_eq(manifest_step_encode(&r, NULL, v), n);
	ck_assert_uint_eq(ckpt_get_le16(v), 3);
	struct manifest_step plain = r;
	plain.meta = NULL;
	plain.meta_len = 0;
	uint8_t pv[512];
	ck_assert_uint_le(manifest_step_encode(&plain, NULL, NULL), sizeof pv);
	manifest_step_encode(&plain, NULL, pv);
	ck_assert_uint_eq(ckpt_get_le16(pv), 2);

	/* Hostile lengths, checksums made right so that only the length is wrong. */
	size_t lenoff = MANIFEST_STEP_REC_FIXED + strlen(r.job_id);
	uint32_t bad[] = { 0, ml + 1, ml - 1, UINT32_MAX, MANIFEST_MAX_META + 1 };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ck_assert_uint_eq(manifest_step_encode(&r, NULL, v), n);
		ckpt_put_le32(v + lenoff, bad[i]);
		ckpt_put_le64(v + n - MANIFEST_CHECK_BYTES, test_rec_check(7, v, n - MANIFEST_CHECK_BYTES));
		uint8_t *p = malloc(n);
		memcpy(p, v, n);
		ck_assert_int_eq(manifest_step_decode(p, n, 7, &got, NULL, 0), CKPT_EFORMAT);
		ck_assert(strstr(ckpt_err_msg(), "step 7") != NULL);
		free(p);
	}
	/* A NUL inside the metadata. */
	ck_assert_uint_eq(manifest_step_encode(&r, NULL, v), n);
	v[lenoff + 4 + ml / 2] = 0;
	ckpt_put_le64(v + n - MANIFEST_CHECK_BYTES, test_rec_check(7, v, n - MANIFEST_CHECK_BYTES));
	ck_assert_int_eq(manifest_step_decode(v, n, 7, &got, NULL, 0), CKPT_EFORMAT);
	/* The metadata's bytes are under the checksum. */
	ck_assert_uint_eq(manifest_step_encode(&r, NULL, v), n);
	v[lenoff + 4] ^= 0x20;
	ck_assert_int_eq(manifest_step_decode(v, n, 7, &got, NULL, 0), CKPT_ECORRUPT);
	/* Too long, or holding a NUL: refused before anything is written. */
	r.meta_len = MANIFEST_MAX_META + 1;
	ck_assert_int_eq(manifest_step_check(&r), -EINVAL);
	free(v);
	free(buf);
	free(meta);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(set_trust)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 11, 3, 0), 0);
	ck_assert_int_eq(manifest_record_abort(m, AREC(12, 3), "x"), 0);
	struct manifest_step before, after;
	ck_assert_int_eq(manifest_step_get(m, 11, &before), 0);
	ck_assert_int_eq(manifest_set_trust(m, 11, CKPT_TRUST_VERIFIED), 0);
	ck_assert_int_eq(manifest_step_get(m, 11, &after), 0);
	ck_assert_uint_eq(after.trust, CKPT_TRUST_VERIFIED);
	after.trust = before.trust;
	ck_assert_mem_eq(&before, &after, sizeof before);    /* nothing else changed */
	for (uint32_t r = 0; r < 3; r++)
		ck_assert_int_eq(shard_verify(m, 11, r, 0), 0);
	ck_assert_int_eq(manifest_set_trust(m, 11, CKPT_TRUST_COMMITTED), 0);
	ck_assert_int_eq(manifest_step_get(m, 11, &after), 0);
	ck_assert_uint_eq(after.trust, CKPT_TRUST_COMMITTED);
	ck_assert_int_eq(manifest_set_trust(m, 13, CKPT_TRUST_VERIFIED), CKPT_ENOTFOUND);
	ck_assert_int_eq(manifest_set_trust(m, 12, CKPT_TRUST_VERIFIED), CKPT_ENOTFOUND);
	ck_assert_int_eq(manifest_set_trust(m, 11, 0), -EINVAL);
	ck_assert_int_eq(manifest_set_trust(m, 11, 3), -EINVAL);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(step_delete)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	for (uint64_t s = 10; s <= 12; s++)
		ck_assert_int_eq(commit_gen(m, s, 5, 0), 0);
	ck_assert_int_eq(manifest_record_abort(m, AREC(13, 5), "x"), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 15);
	ck_assert_int_eq(manifest_step_delete(m, 11), 0);
	struct manifest_step r;
	struct manifest_shard s;
	ck_assert_int_eq(manifest_step_get(m, 11, &r), CKPT_ENOTFOUND);
	for (uint32_t k = 0; k < 5; k++)
		ck_assert_int_eq(manifest_shard_get(m, 11, k, &s), CKPT_ENOTFOUND);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 10);
	step_verify(m, 10, 5, 0);                    /* neighbours untouched */
	step_verify(m, 12, 5, 0);
	ck_assert_int_eq(manifest_step_delete(m, 11), CKPT_ENOTFOUND);
	ck_assert_int_eq(manifest_step_delete(m, 13), 0);      /* aborted records too */
	uint64_t got[4];
	ck_assert_int_eq(manifest_steps_list(m, true, got, 4), 2);
	ck_assert_uint_eq(got[0], 10);
	ck_assert_uint_eq(got[1], 12);
	/* Delete of the latest moves latest back; the step can be committed again. */
	ck_assert_int_eq(manifest_step_delete(m, 12), 0);
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 10);
	ck_assert_int_eq(commit_gen(m, 12, 2, 0), 0);
	step_verify(m, 12, 2, 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(big_index)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	size_t big = (6u << 20) + 123;        /* several MB, not page-aligned */
	ck_assert_int_eq(commit_gen(m, 77, 3, big), 0);
	step_verify(m, 77, 3, big);
	manifest_close(m);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	step_verify(m, 77, 3, big);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

START_TEST(many_steps)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	enum { N = 1000 };
	uint64_t *order = malloc(N * sizeof *order);
	for (size_t i = 0; i < N; i++)
		order[i] = (uint64_t)i * 1000 + 7;
	uint64_t rng = tu_seed();
	for (size_t i = N; i > 1; i--) {
		size_t j = (size_t)(tu_rand(&rng) % i);
		uint64_t t = order[i - 1]; order[i - 1] = order[j]; order[j] = t;
	}
	for (size_t i = 0; i < N; i++) {
		if (order[i] % 7000 == 7)          /* every 7th step: aborted */
			ck_assert_int_eq(manifest_record_abort(m, AREC(order[i], 1), "x"), 0);
		else
			ck_assert_int_eq(commit_gen(m, order[i], 1, 16), 0);
	}
	manifest_close(m);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	uint64_t *got = malloc(N * sizeof *got);
	ck_assert_int_eq(manifest_steps_list(m, true, got, N), N);
	for (size_t i = 0; i < N; i++)
		ck_assert_uint_eq(got[i], (uint64_t)i * 1000 + 7);
	int nc = manifest_steps_list(m, false, got, N);
	ck_assert_int_eq(nc, N - (N + 6) / 7);
	for (int i = 0; i < nc; i++) {
		ck_assert_uint_ne(got[i] % 7000, 7);
		if (i)
			ck_assert_uint_lt(got[i - 1], got[i]);
	}
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, (uint64_t)(N - 1) * 1000 + 7);
	ck_assert_int_eq(shard_verify(m, 500007, 0, 16), 0);
	manifest_close(m);
	free(order);
	free(got);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ corrupt records */

START_TEST(corrupt_step_record)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 7, 2, 0), 0);
	ck_assert_int_eq(commit_gen(m, 8, 2, 0), 0);
	manifest_close(m);

	uint8_t key[8], junk[37];
	manifest_step_key(key, 7);
	memset(junk, 0xA5, sizeof junk);
	junk[0] = 1; junk[1] = 0;                 /* version 1, fields garbage */
	raw_put(root, "steps", key, sizeof key, junk, sizeof junk);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	struct manifest_step r;
	ck_assert_int_eq(manifest_step_get(m, 7, &r), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "step 7"));
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), root));
	ck_assert_int_eq(manifest_step_get(m, 8, &r), 0);
	uint64_t latest, got[4];
	/* 8 is above 7, but the damaged record below is not skipped: it might have been
	 * anything (the latest, under a damaged key). */
	ck_assert_int_eq(manifest_step_latest(m, &latest), CKPT_EFORMAT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "step 7"));
	ck_assert_int_eq(manifest_steps_list(m, false, got, 4), CKPT_EFORMAT);
	manifest_close(m);

	/* A step record from a newer version. */
	uint8_t newer[64] = { 0 };
	ckpt_put_le16(newer, MANIFEST_STEP_REC_VERSION + 1);
	raw_put(root, "steps", key, sizeof key, newer, sizeof newer);
	/* A shard record whose index length points past its end. */
	struct shardset ss;
	shardset_make(&ss, 8, 2, 100);
	size_t n = manifest_shard_rec_size(&ss.sh[1]);
	uint8_t *rec = malloc(n);
	manifest_shard_encode(8, &ss.sh[1], rec);
	ckpt_put_le64(rec + 48, 101);      /* the index length field */
	uint8_t skey[12];
	manifest_shard_key(skey, 8, 1);
	raw_put(root, "shards", skey, sizeof skey, rec, n);
	free(rec);
	shardset_free(&ss);
	/* A key of the wrong size in the steps database. */
	raw_put(root, "steps", "abc", 3, newer, 8);

	ck_assert_int_eq(manifest_open(root, 0, &m), 0);
	ck_assert_int_eq(manifest_step_get(m, 7, &r), CKPT_EVERSION);
	struct manifest_shard s;
	/* Its checksum no longer matches: damage, whatever the field. */
	ck_assert_int_eq(manifest_shard_get(m, 8, 1, &s), CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "rank 1"));
	ck_assert_ptr_null(s.owned_);
	ck_assert_int_eq(shard_verify(m, 8, 0, 0), 0);
	ck_assert_int_eq(manifest_steps_list(m, true, got, 4), CKPT_EVERSION);  /* step 7 first */
	/* Committing over an unreadable record is refused rather than guessed at. */
	ck_assert_int_eq(commit_gen(m, 7, 1, 0), CKPT_EVERSION);
	/* Deleting it works (retention and repair). */
	ck_assert_int_eq(manifest_step_delete(m, 7), 0);
	ck_assert_int_eq(commit_gen(m, 7, 1, 0), 0);
	step_verify(m, 7, 1, 0);
	/* The 3-byte key sorts after every 8-byte one: list and latest meet it. */
	ck_assert_int_eq(manifest_steps_list(m, true, got, 4), CKPT_EFORMAT);
	ck_assert_int_eq(manifest_step_latest(m, &latest), CKPT_EFORMAT);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* Mutate a buffer: flip bytes, overwrite a length field, truncate or extend. */
static size_t mutate(uint8_t *p, size_t n, size_t cap, uint64_t *rng)
{
	switch (tu_rand(rng) % 6) {
	case 0:
		for (int k = 0; k < 1 + (int)(tu_rand(rng) % 4); k++)
			if (n)
				p[tu_rand(rng) % n] ^= (uint8_t)(1u << (tu_rand(rng) % 8));
		return n;
	case 1:
		return n ? (size_t)(tu_rand(rng) % n) : 0;          /* truncate */
	case 2: {
		size_t add = (size_t)(tu_rand(rng) % 16);          /* extend */
		if (n + add > cap)
			add = cap - n;
		tu_fill(p + n, add, tu_rand(rng), 1);
		return n + add;
	}
	case 3:                                                /* random value in a header word */
		if (n >= 48) {
			size_t off = (size_t)(tu_rand(rng) % 44);
			uint32_t v = (uint32_t)tu_rand(rng);
			ckpt_put_le32(p + off, (tu_rand(rng) & 1) ? v : v % 4096);
		}
		return n;
	case 4:                                                /* all random */
		n = (size_t)(tu_rand(rng) % (cap + 1));
		tu_fill(p, n, tu_rand(rng), 2);
		return n;
	default:
		if (n >= 40)                                       /* the shard record's index length */
			ckpt_put_le64(p + 32, tu_rand(rng) >> (tu_rand(rng) % 64));
		return n;
	}
}

static bool ok_code(int rc)
{
	return rc == 0 || rc == CKPT_EFORMAT || rc == CKPT_EVERSION || rc == CKPT_ECORRUPT;
}

START_TEST(fuzz_decoders)
{
	uint64_t rng = tu_seed() ^ 0xD0D0;
	enum { CAP = 2048 };
	uint8_t *buf = malloc(CAP);
	struct shardset ss;
	shardset_make(&ss, 42, 1, 200);
	for (int it = 0; it < 50000; it++) {
		/* step record */
		struct manifest_step r = gen_step(42, 3), out;
		r.state = CKPT_STATE_COMMITTED;
		r.trust = CKPT_TRUST_COMMITTED;
		if (it & 2) {                     /* a version-3 record, with metadata */
			r.meta = "{\"loss\":1.5}";
			r.meta_len = (uint32_t)strlen(r.meta);
		}
		size_t n = manifest_step_encode(&r, (it & 1) ? "why" : NULL, buf);
		n = mutate(buf, n, CAP, &rng);
		/* Decode from an exact-size heap copy so ASan sees any over-read. */
		uint8_t *p = malloc(n ? n : 1);
		memcpy(p, buf, n);
		char note[8];
		int rc = manifest_step_decode(p, n, 42, &out, note, sizeof note);
		ck_assert_msg(ok_code(rc), "step decode: %d (iteration %d)", rc, it);
		if (rc == 0) {
			ck_assert_uint_le(strlen(out.job_id), MANIFEST_MAX_JOB_ID);
			ck_assert_uint_lt(strlen(note), sizeof note);
			ck_assert_uint_le(out.meta_len, MANIFEST_MAX_META);
			if (out.meta_len)
				ck_assert((const uint8_t *)out.meta >= p &&
				          (const uint8_t *)out.meta + out.meta_len <= p + n &&
				          !memchr(out.meta, '\0', out.meta_len));
		}
		free(p);

		/* shard record */
		n = manifest_shard_rec_size(&ss.sh[0]);
		ck_assert_uint_le(n, CAP);
		manifest_shard_encode(42, &ss.sh[0], buf);
		n = mutate(buf, n, CAP, &rng);
		p = malloc(n ? n : 1);
		memcpy(p, buf, n);
		struct manifest_shard s;
		size_t pl = 0;
		rc = manifest_shard_decode(p, n, 42, 0, &s, &pl);
		ck_assert_msg(ok_code(rc), "shard decode: %d (iteration %d)", rc, it);
		if (rc == 0) {
			ck_assert_uint_eq(MANIFEST_SHARD_REC_FIXED + pl + s.index_len + MANIFEST_CHECK_BYTES,
			                  n);
			ck_assert((const uint8_t *)s.path >= p && (const uint8_t *)s.index + s.index_len <= p + n);
			ck_assert(manifest_path_ok(s.path, pl));
		}
		free(p);
	}
	shardset_free(&ss);
	free(buf);
}
END_TEST

/* The same mutations through LMDB and the public readers. */
START_TEST(fuzz_replay_lmdb)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	uint64_t rng = tu_seed() ^ 0xBEEF;
	enum { CAP = 4096 };
	uint8_t *buf = malloc(CAP);
	struct shardset ss;
	shardset_make(&ss, 5, 1, 300);
	for (int it = 0; it < 400; it++) {
		uint64_t step = tu_rand(&rng) % 8;
		struct manifest_step r = gen_step(step, 1);
		r.state = CKPT_STATE_COMMITTED;
		r.trust = CKPT_TRUST_COMMITTED;
		size_t n = manifest_step_encode(&r, NULL, buf);
		n = mutate(buf, n, CAP, &rng);
		uint8_t key[12];
		manifest_step_key(key, step);
		m_put(m, m->dbi_steps, key, 8, buf, n);

		manifest_shard_encode(step, &ss.sh[0], buf);
		n = mutate(buf, manifest_shard_rec_size(&ss.sh[0]), CAP, &rng);
		uint32_t rank = (uint32_t)(tu_rand(&rng) % 2);
		manifest_shard_key(key, step, rank);
		m_put(m, m->dbi_shards, key, 12, buf, n);

		struct manifest_step out;
		int rc = manifest_step_get(m, step, &out);
		ck_assert_msg(ok_code(rc), "step_get: %d", rc);
		struct manifest_shard s;
		rc = manifest_shard_get(m, step, rank, &s);
		ck_assert_msg(ok_code(rc), "shard_get: %d", rc);
		if (rc == 0) {
			ck_assert_uint_eq(strlen(s.path), strnlen(s.path, MANIFEST_MAX_PATH + 1));
			manifest_shard_free(&s);
		}
		uint64_t got[16], latest;
		rc = manifest_steps_list(m, true, got, 16);
		ck_assert_msg(rc >= 0 || ok_code(rc), "list: %d", rc);
		rc = manifest_step_latest(m, &latest);
		ck_assert_msg(ok_code(rc) || rc == CKPT_ENOTFOUND, "latest: %d", rc);
		/* The commit path reads the old record first: it must refuse cleanly too. */
		rc = commit_gen(m, step, 1, 0);
		ck_assert_msg(ok_code(rc) || rc == -EEXIST, "commit: %d", rc);
	}
	shardset_free(&ss);
	free(buf);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ map growth */

START_TEST(map_full_grows_then_enospc)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = NULL;
	/* A 256 KiB map: a 200 KiB index needs the one retry with a doubled map. */
	ck_assert_int_eq(open_map(root, MANIFEST_CREATE, 256 << 10, &m), 0);
	ck_assert_int_eq(commit_gen(m, 1, 1, 100 << 10), 0);
	ck_assert_int_eq(commit_gen(m, 2, 1, 200 << 10), 0);
	step_verify(m, 2, 1, 200 << 10);
	/* Far beyond one doubling: -ENOSPC, nothing stored. */
	ck_assert_int_eq(commit_gen(m, 3, 2, 4 << 20), -ENOSPC);
	struct manifest_step r;
	ck_assert_int_eq(manifest_step_get(m, 3, &r), CKPT_ENOTFOUND);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 2);
	step_verify(m, 1, 1, 100 << 10);
	manifest_close(m);
	/* Reopened with the default map, the big commit fits. */
	m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 3, 2, 4 << 20), 0);
	step_verify(m, 3, 2, 4 << 20);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ shard tables */

/* The attempt of a generated tabular step. */
#define TAB_ID(step) (0x7ab1e00000000000ull | (uint64_t)(step))

/* Shards as lib/commit commits them: canonical paths (with the attempt's save id),
 * no index copy, the footer's place (generated from step and rank). */
static void tabset_make(struct shardset *ss, uint64_t step, uint32_t w)
{
	shardset_make(ss, step, w, 1);
	for (uint32_t r = 0; r < w; r++) {
		struct manifest_shard *s = &ss->sh[r];
		free((void *)s->index);
		s->index = NULL;
		s->index_len = 0;
		s->footer_offset = step * 4096 + r;
		s->footer_len = 1 + (step + r) % 70000;
		ck_assert_int_eq(ckpt_path_shard_rel(ss->paths[r], sizeof ss->paths[r], step, r,
		                                     TAB_ID(step)), 0);
	}
}

static int commit_tab(struct manifest *m, uint64_t step, uint32_t w)
{
	struct shardset ss;
	tabset_make(&ss, step, w);
	uint64_t rng = tu_seed() ^ step;
	shardset_shuffle(&ss, &rng);
	struct manifest_step r = gen_step(step, w);
	r.save_id = TAB_ID(step);
	int rc = manifest_commit(m, &r, ss.sh, w);
	shardset_free(&ss);
	return rc;
}

/* Every rank of a tabset step reads back (0, or a positive code saying what differs).
 * save_id: the attempt the paths carry (0: a version-1 table's, without). */
static int tab_verify_id(struct manifest *m, uint64_t step, uint32_t w, uint64_t save_id)
{
	for (uint32_t r = 0; r < w; r++) {
		struct manifest_shard s;
		int rc = manifest_shard_get(m, step, r, &s);
		if (rc)
			return rc;
		char path[96];
		uint8_t hash[CKPT_HASH_BYTES];
		ckpt_path_shard_rel(path, sizeof path, step, r, save_id);
		tu_fill(hash, sizeof hash, tu_seed(), gen_stream(step, r) ^ 0xF00Du);
		int bad = s.rank != r ? 1 : strcmp(s.path, path) ? 2 :
		          s.file_size != step * 7 + r + 4096 ? 3 :
		          memcmp(s.footer_hash, hash, sizeof hash) ? 4 :
		          s.footer_offset != step * 4096 + r ? 5 :
		          s.footer_len != 1 + (step + r) % 70000 ? 6 :
		          s.index_len ? 7 : 0;
		manifest_shard_free(&s);
		if (bad)
			return bad;
	}
	struct manifest_shard s;
	int rc = manifest_shard_get(m, step, w, &s);
	return rc == CKPT_ENOTFOUND ? 0 : 8;
}

static int tab_verify(struct manifest *m, uint64_t step, uint32_t w)
{
	return tab_verify_id(m, step, w, TAB_ID(step));
}

/* A step of canonical shards is stored as one table value: it reads back rank by
 * rank (before and after reopening), is deleted with its step, and a committed step
 * is still not overwritten. */
START_TEST(table_commit_read_back)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_uint_eq(m->format, MANIFEST_FORMAT_VERSION);
	static const uint32_t ws[] = { 1, 7, 300 };
	for (unsigned i = 0; i < 3; i++)
		ck_assert_int_eq(commit_tab(m, 10 + i, ws[i]), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 3);    /* one table a step */
	for (unsigned i = 0; i < 3; i++)
		ck_assert_int_eq(tab_verify(m, 10 + i, ws[i]), 0);
	ck_assert_int_eq(commit_tab(m, 11, 7), -EEXIST);
	ck_assert_int_eq(tab_verify(m, 11, 7), 0);
	manifest_close(m);

	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	for (unsigned i = 0; i < 3; i++)
		ck_assert_int_eq(tab_verify(m, 10 + i, ws[i]), 0);
	manifest_close(m);

	m = open_create(root);
	ck_assert_int_eq(manifest_step_delete(m, 11), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 2);
	struct manifest_shard s;
	ck_assert_int_eq(manifest_shard_get(m, 11, 0, &s), CKPT_ENOTFOUND);
	ck_assert_int_eq(manifest_record_abort(m, AREC(11, 7), "gone"), 0);
	ck_assert_int_eq(commit_tab(m, 11, 5), 0);              /* over the aborted record */
	ck_assert_int_eq(tab_verify(m, 11, 5), 0);
	ck_assert_int_eq(tab_verify(m, 12, 300), 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* XXH3-64 of val seeded with the XXH3-64 of the key: a record's checksum, computed
 * here independently of the codec (docs/format.md §8.3). */
static uint64_t check_of(const void *key, size_t klen, const void *val, size_t vlen)
{
	return XXH3_64bits_withSeed(val, vlen, XXH3_64bits(key, klen));
}

/* What a table cannot hold goes in per-rank records, in the same manifest: an
 * index copy, a path that is not the canonical one, no save id. A version-1 table
 * (an older build's: no save id, no checksums) still reads. */
START_TEST(table_or_records)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 1, 4, 0), 0);             /* index copies */
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 4);
	step_verify(m, 1, 4, 0);

	struct shardset ss;
	tabset_make(&ss, 2, 3);
	char odd[64] = "elsewhere/rank-000001.shard";
	ss.sh[1].path = odd;
	struct manifest_step r = gen_step(2, 3);
	r.save_id = TAB_ID(2);
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 3), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 7);
	struct manifest_shard s;
	ck_assert_int_eq(manifest_shard_get(m, 2, 1, &s), 0);
	ck_assert_str_eq(s.path, odd);
	ck_assert_uint_eq(s.footer_len, ss.sh[1].footer_len);
	manifest_shard_free(&s);
	shardset_free(&ss);
	ck_assert_int_eq(commit_tab(m, 3, 2), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 8);
	/* A path of another attempt than the step's: records. */
	tabset_make(&ss, 4, 2);
	r = gen_step(4, 2);
	r.save_id = TAB_ID(99);
	ck_assert_int_eq(manifest_commit(m, &r, ss.sh, 2), 0);
	ck_assert_uint_eq(db_entries(m, m->dbi_shards), 10);
	shardset_free(&ss);
	manifest_close(m);

	/* A version-1 table, as an older build wrote it, under step 5. */
	enum { W1 = 3 };
	uint8_t v1[8 + 48 * W1] = { 0 };
	ckpt_put_le16(v1, 1);
	ckpt_put_le32(v1 + 4, W1);
	for (uint32_t k = 0; k < W1; k++) {
		uint8_t *e = v1 + 8 + 48 * k;
		ckpt_put_le32(e, k);
		ckpt_put_le64(e + 8, 5 * 7 + k + 4096);
		tu_fill(e + 16, CKPT_HASH_BYTES, tu_seed(), gen_stream(5, k) ^ 0xF00Du);
		ckpt_put_le64(e + 32, 5 * 4096 + k);
		ckpt_put_le64(e + 40, 1 + (5 + k) % 70000);
	}
	uint8_t key[8];
	manifest_step_key(key, 5);
	raw_put(root, "shards", key, sizeof key, v1, sizeof v1);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	ck_assert_int_eq(tab_verify_id(m, 5, W1, 0), 0);        /* paths without a save id */
	ck_assert_int_eq(tab_verify(m, 3, 2), 0);
	step_verify(m, 1, 4, 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* The canonical-path test is exact: prefix, then the name ckpt_path_shard_name
 * gives for the rank and the step's save id. */
START_TEST(table_path_canonical)
{
	char prefix[MANIFEST_TABLE_PREFIX + 1], path[96];
	manifest_table_prefix(prefix, 42);
	ck_assert_str_eq(prefix, "step-00000000000000000042/");
	struct manifest_shard s = { .footer_len = 1, .path = path };
	const uint64_t id = 0x00c0ffee00000001ull;
	static const uint32_t ranks[] = { 0, 7, 999999, 1000000, 4294967295u };
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(ranks); i++) {
		s.rank = ranks[i];
		ckpt_path_shard_rel(path, sizeof path, 42, s.rank, id);
		ck_assert_msg(manifest_shard_tabular(prefix, id, &s), "%s", path);
		ck_assert_msg(!manifest_shard_tabular(prefix, id + 1, &s), "%s as another attempt", path);
		ck_assert_msg(!manifest_shard_tabular(prefix, 0, &s), "%s without an attempt", path);
		s.rank = ranks[i] + 1;
		ck_assert_msg(!manifest_shard_tabular(prefix, id, &s), "%s as rank %u", path, s.rank);
	}
	s.rank = 3;
	static const char *const bad[] = {
		"step-00000000000000000042/rank-00003-00c0ffee00000001.shard",
		"step-00000000000000000042/rank-000003-00c0ffee00000001.shar",
		"step-00000000000000000042/rank-000003-00c0ffee00000001.shardx",
		"step-00000000000000000043/rank-000003-00c0ffee00000001.shard",
		"step-00000000000000000042/Rank-000003-00c0ffee00000001.shard",
		"step-00000000000000000042/rank-0000003-00c0ffee00000001.shard",
		"step-00000000000000000042/rank-000003-00C0FFEE00000001.shard",
		"step-00000000000000000042/rank-000003.shard",
	};
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		snprintf(path, sizeof path, "%s", bad[i]);
		ck_assert_msg(!manifest_shard_tabular(prefix, id, &s), "%s", path);
	}
	ckpt_path_shard_rel(path, sizeof path, 42, 3, id);
	ck_assert(manifest_shard_tabular(prefix, id, &s));
	s.footer_len = 0;
	ck_assert(!manifest_shard_tabular(prefix, id, &s));
	s.footer_len = 1;
	s.index = "x";
	s.index_len = 1;
	ck_assert(!manifest_shard_tabular(prefix, id, &s));
}
END_TEST

/* Re-seal a table's checksums after a test changed it on purpose, so that the
 * structural checks behind them are reached (header, and entry k). */
static void table_reseal(uint8_t *b, uint64_t step, uint32_t nentries)
{
	uint8_t key[8];
	manifest_step_key(key, step);
	ckpt_put_le64(b + 16, check_of(key, sizeof key, b, 16));
	for (uint32_t k = 0; k < nentries; k++) {
		uint8_t *e = b + MANIFEST_TABLE_HEADER + (size_t)k * MANIFEST_TABLE_ENTRY;
		ckpt_put_le64(e + 48, check_of(key, sizeof key, e, 48));
	}
}

/* A damaged table: every reader gets CKPT_ECORRUPT (a checksum), CKPT_EFORMAT or
 * CKPT_EVERSION naming step and rank, never an out-of-bounds read (the ASan stage
 * runs this), and other steps read on. */
START_TEST(table_corrupt)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_tab(m, 5, 3), 0);
	ck_assert_int_eq(commit_tab(m, 6, 2), 0);
	manifest_close(m);
	struct shardset ss;
	tabset_make(&ss, 5, 3);
	size_t n = manifest_table_size(3);
	uint8_t good[512], b[512];
	ck_assert_uint_le(n, sizeof good);
	manifest_table_header(good, 5, 3, TAB_ID(5));
	for (uint32_t r = 0; r < 3; r++)
		manifest_table_put(good, 5, &ss.sh[r]);
	shardset_free(&ss);
	uint8_t key[8];
	manifest_step_key(key, 5);
	enum { H = MANIFEST_TABLE_HEADER, E = MANIFEST_TABLE_ENTRY };
	/* reseal: the change is made consistent with the checksums, to reach the field
	 * checks behind them; otherwise the checksum catches it. */
	struct { const char *what; size_t len; size_t at; uint64_t v; int width; bool reseal;
	         int want; } cases[] = {
		{ "truncated", 0, 0, 0, 0, false, CKPT_EFORMAT },
		{ "header cut short", 0, 0, 0, 0, false, CKPT_EFORMAT },
		{ "newer version", 0, 0, 3, 2, false, CKPT_EVERSION },
		{ "version 0", 0, 0, 0, 2, false, CKPT_EFORMAT },
		{ "a flipped header bit", 0, 4, 3 ^ 8, 4, false, CKPT_ECORRUPT },
		{ "another step's table", 0, 0, 0, 0, false, CKPT_ECORRUPT },
		{ "reserved", 0, 2, 1, 2, true, CKPT_EFORMAT },
		{ "count 0", 0, 4, 0, 4, true, CKPT_EFORMAT },
		{ "count past the bytes", 0, 4, 4, 4, true, CKPT_EFORMAT },
		{ "save id 0", 0, 8, 0, 8, true, CKPT_EFORMAT },
		{ "a flipped entry bit", 0, H + E + 9, 0xfe, 1, false, CKPT_ECORRUPT },
		{ "entry's rank", 0, H + E, 7, 4, true, CKPT_EFORMAT },
		{ "entry's reserved", 0, H + E + 4, 1, 4, true, CKPT_EFORMAT },
		{ "footer length 0", 0, H + E + 40, 0, 8, true, CKPT_EFORMAT },
		{ "trailing byte", 1, 0, 0, 0, false, CKPT_EFORMAT },
	};
	for (unsigned i = 0; i < CKPT_ARRAY_SIZE(cases); i++) {
		memcpy(b, good, n);
		size_t len = n;
		if (i == 0)
			len = n - 1;
		else if (!strcmp(cases[i].what, "header cut short"))
			len = H - 4;                          /* in its checksum */
		else if (cases[i].len)
			b[len++] = 0;
		else if (!strcmp(cases[i].what, "another step's table"))
			table_reseal(b, 4, 3);                /* sealed for step 4, found under 5 */
		else if (cases[i].width == 1)
			b[cases[i].at] ^= (uint8_t)cases[i].v;
		else if (cases[i].width == 2)
			ckpt_put_le16(b + cases[i].at, (uint16_t)cases[i].v);
		else if (cases[i].width == 4)
			ckpt_put_le32(b + cases[i].at, (uint32_t)cases[i].v);
		else
			ckpt_put_le64(b + cases[i].at, cases[i].v);
		if (cases[i].reseal)
			table_reseal(b, 5, 3);
		raw_put(root, "shards", key, sizeof key, b, len);
		ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
		struct manifest_shard s;
		int rc = manifest_shard_get(m, 5, 1, &s);
		ck_assert_msg(rc == cases[i].want, "%s: %d (%s)", cases[i].what, rc, ckpt_err_msg());
		ck_assert_msg(strstr(ckpt_err_msg(), "step 5") && strstr(ckpt_err_msg(), root),
		              "%s: message '%s'", cases[i].what, ckpt_err_msg());
		ck_assert_ptr_null(s.owned_);
		ck_assert_int_eq(tab_verify(m, 6, 2), 0);
		manifest_close(m);
	}
	/* Rank 0's entry of a table damaged at rank 1 still reads: entries are checked
	 * one at a time (a load reads every rank; checking all on each would be W²). */
	memcpy(b, good, n);
	b[H + E + 20] ^= 1;
	raw_put(root, "shards", key, sizeof key, b, n);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	struct manifest_shard s;
	ck_assert_int_eq(manifest_shard_get(m, 5, 0, &s), 0);
	manifest_shard_free(&s);
	ck_assert_int_eq(manifest_shard_get(m, 5, 1, &s), CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "rank 1"));
	manifest_close(m);
	/* Random damage: a code, never a crash. */
	uint64_t rng = tu_seed() ^ 0x7AB1E;
	m = open_create(root);
	for (int it = 0; it < 300; it++) {
		memcpy(b, good, n);
		size_t len = mutate(b, n, sizeof b, &rng);
		m_put(m, m->dbi_shards, key, sizeof key, b, len);
		for (uint32_t r = 0; r < 4; r++) {
			int rc = manifest_shard_get(m, 5, r, &s);
			ck_assert_msg(ok_code(rc) || rc == CKPT_ENOTFOUND, "rank %u: %d", r, rc);
			if (rc == 0)
				manifest_shard_free(&s);
		}
	}
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* A flipped bit in a step's key inside data.mdb (LMDB pages carry no checksum)
 * makes the record read as another step's: its checksum names it damaged instead,
 * "latest" fails rather than roll back to an older step, and the damaged keys are
 * listed for repair. */
START_TEST(flipped_step_key)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	for (uint64_t st = 1; st <= 3; st++)
		ck_assert_int_eq(commit_tab(m, st * 10, 2), 0);
	/* Step 30's record moved to key 29 (one bit of the key's last byte). */
	MDB_txn *txn;
	ck_assert_int_eq(mdb_txn_begin(m->env, NULL, 0, &txn), 0);
	uint8_t k30[8], k29[8];
	manifest_step_key(k30, 30);
	manifest_step_key(k29, 30 ^ 3);
	MDB_val key = { 8, k30 }, val, key2 = { 8, k29 };
	ck_assert_int_eq(mdb_get(txn, m->dbi_steps, &key, &val), 0);
	void *copy = malloc(val.mv_size);
	memcpy(copy, val.mv_data, val.mv_size);
	MDB_val v2 = { val.mv_size, copy };
	ck_assert_int_eq(mdb_del(txn, m->dbi_steps, &key, NULL), 0);
	ck_assert_int_eq(mdb_put(txn, m->dbi_steps, &key2, &v2, 0), 0);
	ck_assert_int_eq(mdb_txn_commit(txn), 0);
	free(copy);
	struct manifest_step r;
	ck_assert_int_eq(manifest_step_get(m, 29, &r), CKPT_ECORRUPT);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "step 29"));
	ck_assert_int_eq(manifest_step_get(m, 30, &r), CKPT_ENOTFOUND);
	uint64_t latest = 0, bad[4];
	ck_assert_int_eq(manifest_step_latest(m, &latest), CKPT_ECORRUPT);
	ck_assert_int_eq(manifest_steps_damaged(m, bad, 4), 1);
	ck_assert_uint_eq(bad[0], 29);
	/* A bit of a value: the same. */
	ck_assert_int_eq(mdb_txn_begin(m->env, NULL, 0, &txn), 0);
	uint8_t k10[8];
	manifest_step_key(k10, 10);
	MDB_val key10 = { 8, k10 };
	ck_assert_int_eq(mdb_get(txn, m->dbi_steps, &key10, &val), 0);
	copy = malloc(val.mv_size);
	memcpy(copy, val.mv_data, val.mv_size);
	((uint8_t *)copy)[12] ^= 0x10;                /* the world */
	MDB_val v3 = { val.mv_size, copy };
	ck_assert_int_eq(mdb_put(txn, m->dbi_steps, &key10, &v3, 0), 0);
	ck_assert_int_eq(mdb_txn_commit(txn), 0);
	free(copy);
	ck_assert_int_eq(manifest_step_get(m, 10, &r), CKPT_ECORRUPT);
	ck_assert_int_eq(manifest_steps_damaged(m, bad, 4), 2);
	/* Repair: delete the damaged records; the rest reads. */
	ck_assert_int_eq(manifest_step_delete(m, 10), 0);
	ck_assert_int_eq(manifest_step_delete(m, 29), 0);
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 20);
	ck_assert_int_eq(manifest_steps_damaged(m, bad, 4), 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* An INFLIGHT record before the first file of an attempt: it names the attempt and
 * its coordinator, is replaced by the commit of that attempt only, by the abort of
 * any, never over a committed step; an older format is upgraded by the first write. */
START_TEST(inflight_records)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	struct manifest_step id = { .step = 40, .world = 2, .save_id = TAB_ID(40),
	                            .incarnation = 0x1c, .job_id = "j" };
	ck_assert_int_eq(manifest_begin(m, &id), 0);
	struct manifest_step r;
	ck_assert_int_eq(manifest_step_get(m, 40, &r), 0);
	ck_assert(r.state == CKPT_STATE_INFLIGHT && r.save_id == TAB_ID(40) &&
	          r.incarnation == 0x1c && r.world == 2 && !strcmp(r.job_id, "j"));
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(m, &latest), CKPT_ENOTFOUND);   /* invisible */
	/* Another attempt cannot commit over it. */
	struct shardset ss;
	tabset_make(&ss, 40, 2);
	struct manifest_step c = gen_step(40, 2);
	c.save_id = TAB_ID(40) + 1;
	ck_assert_int_eq(manifest_commit(m, &c, ss.sh, 2), -ESTALE);
	c.save_id = TAB_ID(40);
	ck_assert_int_eq(manifest_commit(m, &c, ss.sh, 2), 0);
	ck_assert_int_eq(manifest_step_get(m, 40, &r), 0);
	ck_assert(r.state == CKPT_STATE_COMMITTED && r.save_id == TAB_ID(40));
	ck_assert_int_eq(manifest_begin(m, &id), -EEXIST);
	shardset_free(&ss);
	/* Begin, abort, and an aborted attempt never commits afterwards. */
	id.step = 41;
	id.save_id = TAB_ID(41);
	ck_assert_int_eq(manifest_begin(m, &id), 0);
	ck_assert_int_eq(manifest_record_abort(m, &id, "rank 1 failed"), 0);
	ck_assert_int_eq(manifest_step_get(m, 41, &r), 0);
	ck_assert(r.state == CKPT_STATE_ABORTED && r.save_id == TAB_ID(41));
	ck_assert_int_eq(commit_tab(m, 41, 2), -ESTALE);
	id.save_id = TAB_ID(41) + 7;                  /* a new attempt over the aborted one */
	ck_assert_int_eq(manifest_begin(m, &id), 0);
	/* The old attempt's late abort leaves the new one's record alone: otherwise
	 * the new attempt's files would be named by no record. */
	struct manifest_step late = id;
	late.save_id = TAB_ID(41);
	ck_assert_int_eq(manifest_record_abort(m, &late, "late"), -ESTALE);
	ck_assert_ptr_nonnull(strstr(ckpt_err_msg(), "step 41"));
	ck_assert_int_eq(manifest_step_get(m, 41, &r), 0);
	ck_assert(r.state == CKPT_STATE_INFLIGHT && r.save_id == TAB_ID(41) + 7);
	late.save_id = 0;                              /* rebuild's verdict: every attempt */
	ck_assert_int_eq(manifest_record_abort(m, &late, "unproven"), 0);
	ck_assert_int_eq(manifest_step_get(m, 41, &r), 0);
	ck_assert(r.state == CKPT_STATE_ABORTED && r.save_id == 0);
	manifest_close(m);

	/* A format-2 manifest reads, and is upgraded by its first write. */
	uint8_t v[4];
	ckpt_put_le32(v, 2);
	raw_put(root, "meta", "format", 6, v, sizeof v);
	ck_assert_int_eq(manifest_open(root, 0, &m), 0);
	ck_assert_uint_eq(m->format, 2);
	ck_assert_int_eq(manifest_step_get(m, 40, &r), 0);
	ck_assert_uint_eq(m->format, 2);               /* reading changes nothing */
	ck_assert_int_eq(commit_tab(m, 42, 2), 0);
	ck_assert_uint_eq(m->format, MANIFEST_FORMAT_VERSION);
	manifest_close(m);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	ck_assert_uint_eq(m->format, MANIFEST_FORMAT_VERSION);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ reserved space */

static off_t data_size(const char *root, blkcnt_t *blocks)
{
	char p[4096];
	snprintf(p, sizeof p, "%s/manifest/data.mdb", root);
	struct stat st;
	ck_assert_int_eq(stat(p, &st), 0);
	if (blocks)
		*blocks = st.st_blocks;
	return st.st_size;
}

/* manifest_reserve keeps written zeros past LMDB's last page, commits then land
 * inside them without extending the file, and LMDB reads everything back,
 * before and after a reopen. */
START_TEST(reserve_keeps_commits_in_place)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 1, 4, 0), 0);
	uint64_t used, size;
	ck_assert_int_eq(manifest_file_space(m, &used, &size), 0);
	ck_assert_uint_eq(size, (uint64_t)data_size(root, NULL));
	ck_assert_uint_le(used, size);

	ck_assert_int_eq(manifest_reserve(m, 1u << 20), 0);
	blkcnt_t blocks;
	off_t s1 = data_size(root, &blocks);
	ck_assert_uint_ge((uint64_t)s1, used + (2u << 20));
	ck_assert_uint_eq((uint64_t)s1 % (1u << 20), 0);
	ck_assert_msg((uint64_t)blocks * 512 >= (uint64_t)s1,
	              "reserved space is sparse: %lld blocks for %lld bytes",
	              (long long)blocks, (long long)s1);
	/* Enough left: a second call writes nothing. */
	ck_assert_int_eq(manifest_reserve(m, 1u << 20), 0);
	ck_assert_int_eq(data_size(root, NULL), s1);
	ck_assert_int_eq(manifest_reserve(m, 0), 0);
	ck_assert_int_eq(data_size(root, NULL), s1);

	/* Commits of 64 ranks: the file does not grow while LMDB's pages fit. */
	for (uint64_t st = 2; st < 12; st++) {
		ck_assert_int_eq(commit_gen(m, st, 64, 0), 0);
		ck_assert_int_eq(data_size(root, NULL), s1);
	}
	ck_assert_int_eq(manifest_file_space(m, &used, &size), 0);
	ck_assert_uint_gt(used, 64u << 10);
	ck_assert_uint_lt(used, (uint64_t)s1);

	/* A commit larger than the space left extends the file as before; the next
	 * reserve refills past it. */
	ck_assert_int_eq(commit_gen(m, 20, 2, 3u << 20), 0);
	ck_assert_int_eq(manifest_file_space(m, &used, &size), 0);
	ck_assert_uint_gt(size, (uint64_t)s1);
	ck_assert_int_eq(manifest_reserve(m, 1u << 20), 0);
	ck_assert_int_eq(manifest_file_space(m, &used, &size), 0);
	ck_assert_uint_ge(size, used + (2u << 20));
	for (uint64_t st = 2; st < 12; st++)
		step_verify(m, st, 64, 0);
	manifest_close(m);

	/* Reopened (zeros past the last page are unused space to LMDB): every step
	 * reads back, and a writer commits again. */
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	step_verify(m, 1, 4, 0);
	for (uint64_t st = 2; st < 12; st++)
		step_verify(m, st, 64, 0);
	step_verify(m, 20, 2, 3u << 20);
	ck_assert_int_eq(manifest_reserve(m, 1u << 20), CKPT_ESTATE);
	ck_assert_msg(strstr(ckpt_err_msg(), "read-only"), "%s", ckpt_err_msg());
	manifest_close(m);
	m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 21, 3, 0), 0);
	step_verify(m, 21, 3, 0);
	step_verify(m, 20, 2, 3u << 20);
	ck_assert_int_eq(manifest_reserve(m, UINT64_MAX), -EINVAL);
	ck_assert_int_eq(manifest_reserve(NULL, 1), -EINVAL);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* A reserve that cannot write (here: the file-size limit) fails naming what it
 * did, and leaves the manifest as it was: commits and reads go on. */
START_TEST(reserve_failure_harmless)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 1, 4, 0), 0);
	uint64_t used, size;
	ck_assert_int_eq(manifest_file_space(m, &used, &size), 0);
	struct rlimit was, lim;
	ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
	signal(SIGXFSZ, SIG_IGN);
	lim = was;
	lim.rlim_cur = (rlim_t)size + (64u << 10);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	int rc = manifest_reserve(m, 1u << 20);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
	ck_assert_msg(rc == -EFBIG, "reserve under the limit: %d (%s)", rc, ckpt_err_msg());
	ck_assert_msg(strstr(ckpt_err_msg(), "reserve") && strstr(ckpt_err_msg(), root),
	              "%s", ckpt_err_msg());
	ck_assert_int_eq(commit_gen(m, 2, 4, 0), 0);
	step_verify(m, 1, 4, 0);
	step_verify(m, 2, 4, 0);
	manifest_close(m);
	ck_assert_int_eq(manifest_open(root, MANIFEST_RDONLY, &m), 0);
	step_verify(m, 1, 4, 0);
	step_verify(m, 2, 4, 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* Never past the map: with a 256 KiB map the reserve stops at the map's end. */
START_TEST(reserve_within_map)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = NULL;
	ck_assert_int_eq(open_map(root, MANIFEST_CREATE, 256 << 10, &m), 0);
	ck_assert_int_eq(commit_gen(m, 1, 1, 0), 0);
	ck_assert_int_eq(manifest_reserve(m, 1u << 20), 0);
	ck_assert_int_eq(data_size(root, NULL), 256 << 10);
	ck_assert_int_eq(commit_gen(m, 2, 1, 100 << 10), 0);
	ck_assert_int_eq(data_size(root, NULL), 256 << 10);
	step_verify(m, 1, 1, 0);
	step_verify(m, 2, 1, 100 << 10);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ threads */

struct reader_arg {
	struct manifest *m;
	volatile int    *done;
	int              errors;
	int              rounds;
	size_t           fixed_len;
	char             first_error[256];
};

enum { CONC_W = 3, CONC_STEPS = 40 };

static void reader_fail(struct reader_arg *a, const char *what, uint64_t step, int rc)
{
	if (a->errors++ == 0)
		snprintf(a->first_error, sizeof a->first_error, "%s step %llu: %d %s", what,
		         (unsigned long long)step, rc, ckpt_err_msg());
}

static void *reader_main(void *varg)
{
	struct reader_arg *a = varg;
	uint64_t steps[CONC_STEPS + 1];
	int last_n = 0;
	while (!__atomic_load_n(a->done, __ATOMIC_ACQUIRE) || a->rounds < 3) {
		int n = manifest_steps_list(a->m, true, steps, CONC_STEPS + 1);
		if (n < last_n || n > CONC_STEPS) {   /* commits only add */
			reader_fail(a, "list", 0, n);
			break;
		}
		last_n = n;
		/* Every step is either absent (no record) or complete: its COMMITTED
		 * record and every shard record, byte for byte. */
		for (uint64_t s = 1; s <= CONC_STEPS; s++) {
			struct manifest_step r;
			int rc = manifest_step_get(a->m, s, &r);
			if (rc == CKPT_ENOTFOUND)
				continue;
			if (rc || r.state != CKPT_STATE_COMMITTED || r.world != CONC_W) {
				reader_fail(a, "step_get", s, rc);
				continue;
			}
			for (uint32_t k = 0; k < CONC_W; k++)
				if ((rc = shard_verify(a->m, s, k, a->fixed_len)) != 0)
					reader_fail(a, "shard", s, rc);
		}
		uint64_t latest;
		int rc = manifest_step_latest(a->m, &latest);
		if (rc != 0 && !(rc == CKPT_ENOTFOUND && n == 0))
			reader_fail(a, "latest", 0, rc);
		a->rounds++;
	}
	return NULL;
}

/* 4 reader threads while this thread commits; map_bytes small forces the map to
 * grow (all transactions paused) in the middle of it. */
static void run_concurrent(size_t map_bytes, size_t fixed_len)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = NULL;
	ck_assert_int_eq(open_map(root, MANIFEST_CREATE, map_bytes, &m), 0);
	volatile int done = 0;
	struct reader_arg args[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		memset(&args[i], 0, sizeof args[i]);
		args[i].m = m;
		args[i].done = &done;
		args[i].fixed_len = fixed_len;
		ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main, &args[i]), 0);
	}
	for (uint64_t s = 1; s <= CONC_STEPS; s++) {
		int rc = commit_gen(m, s, CONC_W, fixed_len);
		ck_assert_msg(rc == 0, "commit %llu: %d %s", (unsigned long long)s, rc, ckpt_err_msg());
	}
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ck_assert_msg(args[i].errors == 0, "reader %d: %d errors, first: %s", i,
		              args[i].errors, args[i].first_error);
		ck_assert_int_ge(args[i].rounds, 3);
	}
	ck_assert_int_eq(manifest_steps_list(m, false, NULL, 0), CONC_STEPS);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}

START_TEST(concurrent_readers)
{
	run_concurrent(0, 0);
}
END_TEST

START_TEST(concurrent_readers_growing_map)
{
	/* 40 steps x 3 ranks x 64 KiB from a 256 KiB map: about five doublings. */
	run_concurrent(256 << 10, 64 << 10);
}
END_TEST

/* ------------------------------------------------------------------ no lock access */

/* A reader that may not write lock.mdb (another user's root, a 0555 directory)
 * still reads, through the MDB_NOLOCK fallback. As root, the reader drops to
 * nobody in a child to lose the access. */
START_TEST(rdonly_without_lock_access)
{
	char *root = tu_tmpdir("manifest");
	struct manifest *m = open_create(root);
	ck_assert_int_eq(commit_gen(m, 5, 2, 0), 0);
	manifest_close(m);
	char dir[4096], lock[4096];
	snprintf(dir, sizeof dir, "%s/manifest", root);
	snprintf(lock, sizeof lock, "%s/lock.mdb", dir);
	char data[4200];
	snprintf(data, sizeof data, "%s/data.mdb", dir);
	/* Another user's root shared for reading (files are private by default). */
	ck_assert_int_eq(chmod(root, 0755), 0);
	ck_assert_int_eq(chmod(data, 0444), 0);
	ck_assert_int_eq(chmod(lock, 0444), 0);
	ck_assert_int_eq(chmod(dir, 0555), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
			_exit(10);
		struct manifest *rm = NULL;
		int rc = manifest_open(root, MANIFEST_RDONLY, &rm);
		if (rc) {
			fprintf(stderr, "open: %d %s\n", rc, ckpt_err_msg());
			_exit(2);
		}
		struct manifest_step r;
		if (!rm->nolock)
			_exit(3);
		if (manifest_step_get(rm, 5, &r) != 0 || r.world != 2)
			_exit(4);
		if (shard_verify(rm, 5, 1, 0) != 0)
			_exit(5);
		manifest_close(rm);
		_exit(0);
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	ck_assert_int_eq(chmod(dir, 0755), 0);
	tu_rmtree(root);
	free(root);
}
END_TEST

/* ------------------------------------------------------------------ durability */

START_TEST(commit_survives_exit)
{
	char *root = tu_tmpdir("manifest");
	/* The parent has no environment open across fork (an LMDB rule). */
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct manifest *m = NULL;
		if (manifest_open(root, MANIFEST_CREATE, &m) != 0)
			_exit(2);
		if (commit_gen(m, 42, 4, 0) != 0)
			_exit(3);
		_exit(0);          /* no close, no atexit, no stdio flush */
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	struct manifest *m = NULL;
	ck_assert_int_eq(manifest_open(root, 0, &m), 0);   /* also clears the dead reader */
	step_verify(m, 42, 4, 0);
	uint64_t latest;
	ck_assert_int_eq(manifest_step_latest(m, &latest), 0);
	ck_assert_uint_eq(latest, 42);
	ck_assert_int_eq(commit_gen(m, 43, 1, 0), 0);
	manifest_close(m);
	tu_rmtree(root);
	free(root);
}
END_TEST

int main(void)
{
	tu_seed();
	Suite *s = suite_create("manifest");
	TCase *tc = tcase_create("manifest");
	tcase_add_test(tc, create_open_reopen);
	tcase_add_test(tc, open_missing_root);
	tcase_add_test(tc, open_not_a_manifest);
	tcase_add_test(tc, format_version_newer);
	tcase_add_test(tc, commit_read_back);
	tcase_add_test(tc, commit_twice_eexist);
	tcase_add_test(tc, commit_bad_shards_einval);
	tcase_add_test(tc, order_and_latest);
	tcase_add_test(tc, aborted_steps);
	tcase_add_test(tc, set_trust);
	tcase_add_test(tc, step_meta);
	tcase_add_test(tc, step_delete);
	tcase_add_test(tc, big_index);
	tcase_add_test(tc, many_steps);
	tcase_add_test(tc, corrupt_step_record);
	tcase_add_test(tc, fuzz_decoders);
	tcase_add_test(tc, fuzz_replay_lmdb);
	tcase_add_test(tc, map_full_grows_then_enospc);
	tcase_add_test(tc, table_commit_read_back);
	tcase_add_test(tc, table_or_records);
	tcase_add_test(tc, table_path_canonical);
	tcase_add_test(tc, flipped_step_key);
	tcase_add_test(tc, inflight_records);
	tcase_add_test(tc, table_corrupt);
	tcase_add_test(tc, reserve_keeps_commits_in_place);
	tcase_add_test(tc, reserve_within_map);
	tcase_add_test(tc, reserve_failure_harmless);
	tcase_add_test(tc, concurrent_readers);
	tcase_add_test(tc, concurrent_readers_growing_map);
	tcase_add_test(tc, rdonly_without_lock_access);
	tcase_add_test(tc, commit_survives_exit);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
