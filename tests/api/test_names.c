/*
 * test_names.c — tensor and blob names through the public API: every save entry
 * point refuses names that are not well-formed UTF-8 (overlong, surrogate, above
 * U+10FFFF, cut short, lone continuation) with CKPT_ENAME and a message that quotes
 * the name without copying its bad bytes; multi-byte names save and load back; and
 * a checkpoint written before the UTF-8 rule, holding such names, still loads by
 * them.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "legacy_root.h"
#include "testutil.h"

static char *root;

static void setup(void)
{
	root = tu_tmpdir("names");
	unsetenv("CKPT_FAULT");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
}

static void teardown(void)
{
	tu_rmtree(root);
	free(root);
	root = NULL;
}

static ckpt_ctx *open_rw(const char *r, unsigned flags)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = r;
	o.rank = 0;
	o.world = 1;
	o.flags = flags;
	o.zstd_level = 0;
	ckpt_ctx *c = NULL;
	ck_assert_msg(ckpt_open(&o, &c) == 0, "open %s: %s", r, ckpt_last_error());
	return c;
}

/* The kinds of bytes that are not UTF-8, and how a message must quote them. */
static const struct { const char *bytes, *quoted; } bad[] = {
	{ "\xc0\xaf", "\\xc0\\xaf" },                    /* overlong '/' */
	{ "\xed\xa0\x80", "\\xed\\xa0\\x80" },           /* surrogate U+D800 */
	{ "\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80" },  /* above U+10FFFF */
	{ "\xe2\x82", "\\xe2\\x82" },                    /* truncated */
	{ "\x80", "\\x80" },                             /* lone continuation */
};
#define NBAD (sizeof bad / sizeof *bad)

static int no_source(void *arg, uint64_t off, void *dst, size_t len)
{
	(void)arg;
	(void)off;
	memset(dst, 0, len);
	return 0;
}

/* rc is CKPT_ENAME and the message quotes name: the escaped bytes, "UTF-8", the
 * valid prefix as it is, and no byte that is not UTF-8. */
static void check_refused(int rc, const char *what, size_t i, const char *prefix)
{
	const char *msg = ckpt_last_error();
	ck_assert_msg(rc == CKPT_ENAME, "%s bad[%zu]: rc %d", what, i, rc);
	ck_assert_msg(tu_utf8_ok((const unsigned char *)msg, strlen(msg)), "%s bad[%zu]: message "
	              "holds bytes that are not UTF-8", what, i);
	ck_assert_msg(strstr(msg, bad[i].quoted) && strstr(msg, prefix) && strstr(msg, "UTF-8"),
	              "%s bad[%zu]: '%s'", what, i, msg);
	ck_assert_ptr_null(strstr(msg, bad[i].bytes));
}

START_TEST(invalid_utf8_refused)
{
	ckpt_ctx *c = open_rw(root, 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 1, &s), 0);
	float data[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint64_t shape[1] = { 8 };
	for (size_t i = 0; i < NBAD; i++) {
		char name[64];
		snprintf(name, sizeof name, "layer.%zu/w\xce\xb1-%s", i, bad[i].bytes);
		ck_assert(!tu_utf8_ok((const unsigned char *)name, strlen(name)));
		char prefix[32];
		snprintf(prefix, sizeof prefix, "layer.%zu/w\xce\xb1-", i);
		struct ckpt_tensor t = { .name = name, .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		                         .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
		                         .data = data, .mem = CKPT_MEM_HOST };
		check_refused(ckpt_save_add_tensor(s, &t), "add_tensor", i, prefix);
		check_refused(ckpt_save_add_tensor_source(s, &t, no_source, NULL), "add_tensor_source",
		              i, prefix);
		check_refused(ckpt_save_add_blob(s, name, CKPT_KIND_EXTRA, CKPT_REPLICATED, data, 4),
		              "add_blob", i, prefix);
		/* The checker says the same, and a bad byte alone is refused too. */
		ck_assert_int_eq(ckpt_name_check(name, strlen(name)), CKPT_ENAME);
		ck_assert_int_eq(ckpt_name_check(bad[i].bytes, strlen(bad[i].bytes)), CKPT_ENAME);
	}
	/* The save is still usable: refused names left nothing behind. */
	struct ckpt_tensor t = { .name = "w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
	                         .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
	                         .data = data, .mem = CKPT_MEM_HOST };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &t), 0);
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, -1), 0);
	ckpt_save_free(s);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 1, &l), 0);
	ck_assert_int_eq(ckpt_load_count(l), 1);
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

/* A tensor source that serves the bytes of a float array. */
static int from_array(void *arg, uint64_t off, void *dst, size_t len)
{
	memcpy(dst, (const uint8_t *)arg + off, len);
	return 0;
}

START_TEST(multibyte_names_round_trip)
{
	static const char *const names[] = {
		"model/\xce\xb1\xce\xb2.weight",                      /* 2-byte: αβ */
		"\xe6\xa8\xa1\xe5\x9e\x8b/\xe9\x87\x8d\xe3\x81\xbf",  /* 3-byte */
		"emoji/\xf0\x9f\x98\x80",                             /* 4-byte */
		"edge/\xf4\x8f\xbf\xbf-\xef\xbf\xbf-\xee\x80\x80-\xed\x9f\xbf", /* U+10FFFF, U+FFFF, U+E000, U+D7FF */
		"blob/\xc2\x80\xdf\xbf",                              /* U+0080, U+07FF: a blob */
	};
	enum { N = sizeof names / sizeof *names, ELEMS = 300 };
	float data[N][ELEMS];
	for (size_t i = 0; i < N; i++)
		for (size_t k = 0; k < ELEMS; k++)
			data[i][k] = (float)(i * 1000 + k);
	ckpt_ctx *c = open_rw(root, 0);
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 3, &s), 0);
	uint64_t shape[1] = { ELEMS };
	for (size_t i = 0; i < N; i++) {
		ck_assert_int_eq(ckpt_name_check(names[i], strlen(names[i])), 0);
		struct ckpt_tensor t = { .name = names[i], .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		                         .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
		                         .data = data[i], .mem = CKPT_MEM_HOST };
		int rc = i == N - 1 ? ckpt_save_add_blob(s, names[i], CKPT_KIND_EXTRA, CKPT_REPLICATED,
		                                         data[i], sizeof data[i]) :
		         i == 2 ? ckpt_save_add_tensor_source(s, &t, from_array, data[i]) :
		         ckpt_save_add_tensor(s, &t);
		ck_assert_msg(rc == 0, "%zu: %s", i, ckpt_last_error());
	}
	ck_assert_int_eq(ckpt_save_submit(s), 0);
	ck_assert_msg(ckpt_save_wait(s, -1) == 0, "%s", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);

	c = open_rw(root, CKPT_OPEN_READONLY);
	ckpt_load *l;
	ck_assert_int_eq(ckpt_load_open(c, 3, &l), 0);
	ck_assert_int_eq(ckpt_load_count(l), N);
	for (size_t i = 0; i < N; i++) {
		bool found = false;
		for (int k = 0; k < ckpt_load_count(l); k++) {
			struct ckpt_tensor_info ti;
			ck_assert_int_eq(ckpt_load_info(l, (unsigned)k, &ti, sizeof ti), 0);
			found |= !strcmp(ti.name, names[i]);
		}
		ck_assert_msg(found, "name %zu not listed", i);
		float got[ELEMS];
		memset(got, 0, sizeof got);
		if (i == N - 1) {
			size_t len = 0;
			ck_assert_int_eq(ckpt_load_blob(l, names[i], got, sizeof got, &len), 0);
			ck_assert_uint_eq(len, sizeof got);
		} else {
			ck_assert_msg(ckpt_load_tensor(l, names[i], CKPT_F32, 1, NULL, NULL, got,
			                               CKPT_MEM_HOST) == 0, "%s", ckpt_last_error());
		}
		ck_assert(!memcmp(got, data[i], sizeof got));
	}
	ckpt_load_close(l);
	ckpt_close(c);
}
END_TEST

/* A checkpoint written before names had to be UTF-8 stays readable: listed with its
 * stored bytes, loaded by them, verified; only new saves of such names are refused. */
START_TEST(legacy_names_load)
{
	ck_assert_int_eq(legacy_root_make(root, 5), 0);
	ckpt_ctx *c = open_rw(root, CKPT_OPEN_READONLY);
	ckpt_load *l;
	ck_assert_msg(ckpt_load_open(c, 5, &l) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_load_count(l), (int)legacy_nbad + 2);
	float want[LEGACY_ELEMS], got[LEGACY_ELEMS];
	for (size_t i = 0; i < legacy_nbad + 2; i++) {
		const char *name = i < legacy_nbad ? legacy_bad_names[i] :
		                   i == legacy_nbad ? LEGACY_GOOD_UTF8 : LEGACY_PLAIN;
		bool found = false;
		for (int k = 0; k < ckpt_load_count(l); k++) {
			struct ckpt_tensor_info ti;
			ck_assert_int_eq(ckpt_load_info(l, (unsigned)k, &ti, sizeof ti), 0);
			found |= !strcmp(ti.name, name);
		}
		ck_assert_msg(found, "name %zu not listed with its stored bytes", i);
		legacy_fill(want, i);
		memset(got, 0, sizeof got);
		ck_assert_msg(ckpt_load_tensor(l, name, CKPT_F32, 1, NULL, NULL, got,
		                               CKPT_MEM_HOST) == 0, "%zu: %s", i, ckpt_last_error());
		ck_assert(!memcmp(got, want, sizeof got));
	}
	ckpt_load_close(l);
	ckpt_close(c);

	c = open_rw(root, CKPT_OPEN_NO_GC);
	struct ckpt_verify_result *r = calloc(1, sizeof *r);
	r->size = sizeof *r;
	ck_assert_msg(ckpt_catalog_verify(c, 5, NULL, r) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(r->marked, 1);
	free(r);
	/* A new save may not write such a name, even into this root. */
	ckpt_save *s;
	ck_assert_int_eq(ckpt_save_begin(c, 6, &s), 0);
	ck_assert_int_eq(ckpt_save_add_blob(s, legacy_bad_names[0], CKPT_KIND_EXTRA,
	                                    CKPT_REPLICATED, "x", 1), CKPT_ENAME);
	ckpt_save_free(s);
	ckpt_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("names");
	TCase *tc = tcase_create("names");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, invalid_utf8_refused);
	tcase_add_test(tc, multibyte_names_round_trip);
	tcase_add_test(tc, legacy_names_load);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
