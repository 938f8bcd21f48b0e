/*
 * test_base.c — the base tier: names, sizes, errors, fault table, allocation failure,
 * cursor, buffer, paths.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "testutil.h"

START_TEST(names)
{
	ck_assert_int_eq(ckpt_name_check("model/layers.0/weight", 21), 0);
	ck_assert_int_eq(ckpt_name_check("a", 1), 0);
	ck_assert_int_eq(ckpt_name_check("", 0), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a/../b", 6), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("..", 2), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("./a", 3), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("/a", 2), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a//b", 4), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a/", 2), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a\0b", 3), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("a\nb", 3), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check("..a/b..", 7), 0);
	char *big = malloc(65536);
	memset(big, 'x', 65536);
	ck_assert_int_eq(ckpt_name_check(big, 65536), CKPT_ENAME);
	ck_assert_int_eq(ckpt_name_check(big, CKPT_MAX_NAME), 0);
	ck_assert_int_eq(ckpt_name_check(big, CKPT_MAX_NAME + 1), CKPT_ENAME);
	free(big);
}
END_TEST

/* Well-formed UTF-8 is required of new names (RFC 3629); the structural rules alone
 * (ckpt_name_problem with utf8 false) are what a shard read back must keep. */
START_TEST(names_utf8)
{
	static const char *const good[] = {
		"\x7f", "\xc2\x80", "\xdf\xbf",                    /* U+007F, U+0080, U+07FF */
		"\xe0\xa0\x80", "\xed\x9f\xbf", "\xee\x80\x80",    /* U+0800, U+D7FF, U+E000 */
		"\xef\xbf\xbf", "\xf0\x90\x80\x80",                /* U+FFFF, U+10000 */
		"\xf4\x8f\xbf\xbf",                                /* U+10FFFF */
		"model/\xce\xb1\xce\xb2/\xe6\x97\xa5\xe6\x9c\xac/\xf0\x9f\x98\x80.weight",
	};
	static const char *const bad[] = {
		"\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xe0\x9f\xbf",  /* overlong */
		"\xf0\x80\x80\xaf", "\xf0\x8f\xbf\xbf",
		"\xed\xa0\x80", "\xed\xbf\xbf",                          /* surrogates */
		"\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xf7\xbf\xbf\xbf", /* > U+10FFFF */
		"\xfe", "\xff",
		"\xe2\x82", "\xe2\x82" "a", "\xf0\x9f\x98", "a\xc2",    /* truncated */
		"\x80", "a\xbf", "\xc2\xc0", "\xe2\x28\xa1",             /* lone or bad continuation */
		"layer/\xce\xb1/\xc0\xaf/w",
	};
	for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
		ck_assert_msg(ckpt_name_check(good[i], strlen(good[i])) == 0, "good[%zu]", i);
		ck_assert_ptr_null(ckpt_name_problem(good[i], strlen(good[i]), false));
	}
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		size_t n = strlen(bad[i]);
		ck_assert_msg(ckpt_name_check(bad[i], n) == CKPT_ENAME, "bad[%zu]", i);
		ck_assert_str_eq(ckpt_name_problem(bad[i], n, true), "not well-formed UTF-8");
		/* Only the UTF-8 rule: a stored name like this still decodes. */
		ck_assert_msg(ckpt_name_problem(bad[i], n, false) == NULL, "bad[%zu] structural", i);
	}
	/* The structural rules hold whatever the bytes. */
	ck_assert_ptr_nonnull(ckpt_name_problem("a/../\xc0\xaf", 7, false));
	ck_assert_ptr_nonnull(ckpt_name_problem("/\xc0\xaf", 3, false));
	ck_assert_ptr_nonnull(ckpt_name_problem("\xc0\n", 2, false));
	ck_assert_ptr_nonnull(ckpt_name_problem("\xc0\0", 2, false));

	/* Quoting for messages: valid characters kept, every other byte escaped. */
	char q[CKPT_NAME_QUOTE_CAP];
	ck_assert_str_eq(ckpt_name_quote("a\xc0\xaf" "b", 4, q, sizeof q), "a\\xc0\\xafb");
	ck_assert_str_eq(ckpt_name_quote("\xce\xb1\xed\xa0\x80", 5, q, sizeof q),
	                 "\xce\xb1\\xed\\xa0\\x80");
	ck_assert_str_eq(ckpt_name_quote("x\n\x01", 3, q, sizeof q), "x\\x0a\\x01");
	ck_assert_str_eq(ckpt_name_quote("\xe2\x82", 2, q, sizeof q), "\\xe2\\x82");
	char big[300];
	memset(big, 0xff, sizeof big);
	ckpt_name_quote(big, sizeof big, q, sizeof q);
	ck_assert_uint_le(strlen(q), sizeof q - 1);
	ck_assert_str_eq(q + strlen(q) - 3, "...");
	ck_assert_ptr_null(ckpt_name_problem(q, strlen(q), true));   /* printable UTF-8 */
	memset(big, 'n', sizeof big);
	ckpt_name_quote(big, sizeof big, q, sizeof q);
	ck_assert_uint_eq(strlen(q), CKPT_NAME_QUOTE_BYTES + 3);
	char small[8];
	ck_assert_str_eq(ckpt_name_quote("\xc0\xaf", 2, small, sizeof small), "\\xc0...");
}
END_TEST

/* Every string of 1 to 3 bytes after "x" (so that no structural rule applies: no
 * control byte, no '/'), and every 4-byte lead with every second byte and the edge
 * values of the others: the checker agrees with the oracle on each. */
START_TEST(names_utf8_exhaustive)
{
	unsigned char s[5] = { 'x' };
	unsigned long checked = 0;
	for (unsigned n = 1; n <= 3; n++) {
		unsigned long total = 1ul << (8 * n);
		for (unsigned long v = 0; v < total; v++) {
			bool skip = false;
			for (unsigned k = 0; k < n; k++) {
				s[1 + k] = (unsigned char)(v >> (8 * k));
				skip |= s[1 + k] < 0x20 || s[1 + k] == '/';
			}
			if (skip)
				continue;
			/* Not ck_assert: Check records a mark for every one that passes. */
			bool ok = ckpt_name_check((const char *)s, 1 + n) == 0;
			if (ok != tu_utf8_ok(s, 1 + n))
				ck_abort_msg("%u bytes %06lx: checker says %d", n, v, ok);
			checked++;
		}
	}
	static const unsigned char edge[] = { 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0 };
	for (unsigned b0 = 0xf0; b0 <= 0xff; b0++)
		for (unsigned b1 = 0x20; b1 <= 0xff; b1++)
			for (unsigned i = 0; i < sizeof edge; i++)
				for (unsigned j = 0; j < sizeof edge; j++) {
					if (b1 == '/')
						continue;
					unsigned char q[5] = { 'x', (unsigned char)b0, (unsigned char)b1, edge[i],
					                       edge[j] };
					bool ok = ckpt_name_check((const char *)q, 5) == 0;
					if (ok != tu_utf8_ok(q, 5))
						ck_abort_msg("%02x %02x %02x %02x: checker says %d", b0, b1,
						             edge[i], edge[j], ok);
					checked++;
				}
	ck_assert_uint_gt(checked, 10000000);
}
END_TEST

START_TEST(sizes)
{
	uint64_t v;
	ck_assert_int_eq(ckpt_parse_size("4096", &v), 0); ck_assert_uint_eq(v, 4096);
	ck_assert_int_eq(ckpt_parse_size("16M", &v), 0); ck_assert_uint_eq(v, 16u << 20);
	ck_assert_int_eq(ckpt_parse_size("4GiB", &v), 0); ck_assert_uint_eq(v, 4ull << 30);
	ck_assert_int_eq(ckpt_parse_size("2k", &v), 0); ck_assert_uint_eq(v, 2048);
	ck_assert_int_eq(ckpt_parse_size("", &v), -EINVAL);
	ck_assert_int_eq(ckpt_parse_size("-1", &v), -EINVAL);
	ck_assert_int_eq(ckpt_parse_size("12Q", &v), -EINVAL);
	ck_assert_int_eq(ckpt_parse_size("99999999999T", &v), -EINVAL);
	uint64_t shape[3] = { 1ull << 32, 1ull << 32, 2 };
	ck_assert(!ckpt_shape_elems(3, shape, &v));
	ck_assert(ckpt_shape_elems(2, shape + 1, &v));
	ck_assert_uint_eq(v, 1ull << 33);
	ck_assert(ckpt_shape_elems(0, NULL, &v));
	ck_assert_uint_eq(v, 1);
	ck_assert(ckpt_range_ok(10, 5, 15));
	ck_assert(!ckpt_range_ok(10, 6, 15));
	ck_assert(!ckpt_range_ok(UINT64_MAX, 2, UINT64_MAX));
}
END_TEST

START_TEST(errors)
{
	ck_assert_str_eq(ckpt_strerror(-ENOSPC), "No space left on device");
	ck_assert_ptr_nonnull(strstr(ckpt_strerror(CKPT_ECORRUPT), "corrupt"));
	ck_assert_str_eq(ckpt_strerror(-99999), "unknown error");
	ck_assert_str_eq(ckpt_strerror(12345), "unknown error");
	int rc = ckpt_err(CKPT_ENOTFOUND, "step %d", 7);
	ck_assert_int_eq(rc, CKPT_ENOTFOUND);
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "step 7"));
	ckpt_err_prefix(CKPT_ENOTFOUND, "load of root /x");
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "load of root /x: step 7"));
	for (int d = 1; d <= CKPT_DTYPE_MAX_; d++) {
		ck_assert_uint_gt(ckpt_dtype_size(d), 0);
		ck_assert_str_ne(ckpt_dtype_name(d), "?");
	}
	ck_assert_uint_eq(ckpt_dtype_size(0), 0);
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_DTYPE_MAX_ + 1), 0);
}
END_TEST

START_TEST(fault_table)
{
	for (int p = 0; p < CKPT_FP_COUNT_; p++)
		ck_assert_str_ne(ckpt_fault_point_name((enum ckpt_fault_point)p), "?");
	setenv("CKPT_FAULT", "before_fdatasync:2:eio", 1);
	unsetenv("CKPT_FAULT_RANK");
	ckpt_fault_reload();
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_CHUNK_WRITE), 0);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), 0);   /* first hit */
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), -EIO); /* second */
	ck_assert_ptr_nonnull(strstr(ckpt_last_error(), "before_fdatasync"));
	ck_assert_int_eq(ckpt_fault(CKPT_FP_BEFORE_FDATASYNC), 0);
	setenv("CKPT_FAULT", "after_prepare_sent:drop", 1);
	setenv("CKPT_FAULT_RANK", "3", 1);
	ckpt_fault_reload();
	ckpt_fault_set_rank(2);
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_PREPARE_SENT), 0);
	ckpt_fault_set_rank(3);
	ckpt_fault_reload();
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_PREPARE_SENT), CKPT_FA_DROP);
	setenv("CKPT_FAULT", "coord_after_commit_txn", 1);
	unsetenv("CKPT_FAULT_RANK");
	ckpt_fault_reload();
	pid_t pid = fork();
	if (pid == 0) {
		ckpt_fault(CKPT_FP_COORD_AFTER_COMMIT_TXN);
		_exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	ck_assert(WIFEXITED(st));
	ck_assert_int_eq(WEXITSTATUS(st), CKPT_FAULT_CRASH_STATUS);
	/* delay sleeps at the nth hit only, slow at every hit from the nth on. A hit
	 * that must not sleep may take up to 150 ms: a loaded machine is slow too. */
	setenv("CKPT_FAULT", "after_chunk_write:2:slow:200", 1);
	ckpt_fault_reload();
	uint64_t t0 = ckpt_now_ns();
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_CHUNK_WRITE), 0);
	ck_assert_uint_lt(ckpt_now_ns() - t0, 150000000u);
	for (int i = 0; i < 3; i++) {
		t0 = ckpt_now_ns();
		ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_CHUNK_WRITE), 0);
		ck_assert_uint_ge(ckpt_now_ns() - t0, 200000000u);
	}
	setenv("CKPT_FAULT", "after_chunk_write:1:delay:200", 1);
	ckpt_fault_reload();
	t0 = ckpt_now_ns();
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_CHUNK_WRITE), 0);
	ck_assert_uint_ge(ckpt_now_ns() - t0, 200000000u);
	t0 = ckpt_now_ns();
	ck_assert_int_eq(ckpt_fault(CKPT_FP_AFTER_CHUNK_WRITE), 0);
	ck_assert_uint_lt(ckpt_now_ns() - t0, 150000000u);
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}
END_TEST

/* The allocation hook: the nth counted call fails once, with libc's contract; the
 * env form counts from the reload; 0 disarms; live blocks are counted. */
START_TEST(alloc_failure)
{
	unsetenv("CKPT_FAULT");
	unsetenv("CKPT_FAULT_RANK");
	ckpt_fault_reload();
	int64_t live = ckpt_fault_alloc_live();
	ckpt_fault_alloc_arm(3);
	void *a = ckpt_malloc(8);
	char *b = ckpt_strdup("x");
	errno = 0;
	void *c = ckpt_calloc(2, 8);               /* the third: fails */
	ck_assert_ptr_null(c);
	ck_assert_int_eq(errno, ENOMEM);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	void *d = ckpt_realloc(a, 64);             /* the fourth: the failure was once */
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(ckpt_fault_alloc_count(), 4);
	ckpt_fault_alloc_arm(1);
	ck_assert_ptr_null(ckpt_realloc(d, 128));  /* d stays allocated, unchanged */
	void *e = NULL;
	ckpt_fault_alloc_arm(1);
	ck_assert_int_eq(ckpt_posix_memalign(&e, 4096, 4096), ENOMEM);
	ck_assert_ptr_nonnull(e = ckpt_aligned_alloc(4096, 4096));   /* the second passes */
	ckpt_free(e);
	ckpt_fault_alloc_arm(0);
	ck_assert_int_eq(ckpt_posix_memalign(&e, 4096, 4096), 0);
	ck_assert_uint_eq(ckpt_fault_alloc_count(), 1);
	ckpt_free(e);
	ck_assert_int_eq(ckpt_fault_alloc_live(), live + 2);   /* d and b */
	ckpt_free(d);
	ckpt_free(b);
	ckpt_free(NULL);
	ck_assert_int_eq(ckpt_fault_alloc_live(), live);
	setenv("CKPT_FAULT", "alloc:2", 1);
	ckpt_fault_reload();
	void *f = ckpt_malloc(1);
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_null(ckpt_malloc(1));
	ckpt_free(f);
	setenv("CKPT_FAULT", "alloc:0", 1);        /* malformed: ignored, nothing armed */
	ckpt_fault_reload();
	ck_assert_ptr_nonnull(f = ckpt_malloc(1));
	ckpt_free(f);
	unsetenv("CKPT_FAULT");
	ckpt_fault_reload();
}
END_TEST

START_TEST(cursor_and_buf)
{
	struct ckpt_buf b;
	ckpt_buf_init(&b);
	ckpt_buf_u8(&b, 7);
	ckpt_buf_u16(&b, 0xBEEF);
	ckpt_buf_u32(&b, 0xDEADBEEF);
	ckpt_buf_u64(&b, 0x0123456789ABCDEFull);
	for (int i = 0; i < 1000; i++)
		ckpt_buf_u32(&b, (uint32_t)i);
	ck_assert(b.ok);
	ck_assert_uint_eq(b.len, 15 + 4000);
	struct ckpt_cursor c;
	ckpt_cursor_init(&c, b.p, b.len);
	ck_assert_uint_eq(ckpt_cursor_u8(&c), 7);
	ck_assert_uint_eq(ckpt_cursor_u16(&c), 0xBEEF);
	ck_assert_uint_eq(ckpt_cursor_u32(&c), 0xDEADBEEF);
	ck_assert_uint_eq(ckpt_cursor_u64(&c), 0x0123456789ABCDEFull);
	for (int i = 0; i < 1000; i++)
		ck_assert_uint_eq(ckpt_cursor_u32(&c), (uint32_t)i);
	ck_assert(c.ok);
	ck_assert_uint_eq(ckpt_cursor_u8(&c), 0);
	ck_assert(!c.ok);
	ck_assert_ptr_null(ckpt_cursor_take(&c, 0));
	ckpt_buf_free(&b);
}
END_TEST

START_TEST(paths)
{
	char p[64];
	uint64_t s;
	ck_assert_int_eq(ckpt_path_step_dir(p, sizeof p, "/r", 42), 0);
	ck_assert_str_eq(p, "/r/step-00000000000000000042");
	ck_assert(ckpt_path_parse_step_dir(p + 3, &s));
	ck_assert_uint_eq(s, 42);
	ck_assert_int_eq(ckpt_path_shard_rel(p, sizeof p, UINT64_MAX, 3, 0), 0);
	ck_assert_str_eq(p, "step-18446744073709551615/rank-000003.shard");
	char q[96];
	ck_assert_int_eq(ckpt_path_shard_rel(q, sizeof q, 7, 4000000, 0x00ab00000000cdefull), 0);
	ck_assert_str_eq(q, "step-00000000000000000007/rank-4000000-00ab00000000cdef.shard");
	ck_assert_int_eq(ckpt_path_shard_rel(q, 50, 7, 4000000, 0xab), -ENAMETOOLONG);
	/* The name parses back, and only the one spelling of it does. */
	uint32_t r;
	uint64_t id;
	ck_assert(ckpt_path_parse_shard("rank-4000000-00ab00000000cdef.shard", &r, &id));
	ck_assert(r == 4000000 && id == 0x00ab00000000cdefull);
	ck_assert(ckpt_path_parse_shard("rank-000003.shard", &r, &id));
	ck_assert(r == 3 && id == 0);
	ck_assert(ckpt_path_parse_shard("rank-4294967295-ffffffffffffffff.shard", &r, &id));
	ck_assert(r == UINT32_MAX && id == UINT64_MAX);
	static const char *const bad[] = {
		"rank-00003.shard", "rank-0000003.shard", "rank-4294967296.shard",
		"rank-000003-00ab00000000cdeF.shard", "rank-000003-00ab00000000cde.shard",
		"rank-000003-0000000000000000.shard", "rank-000003-00ab00000000cdef0.shard",
		"rank-000003.shard.tmp", "rank-000003", "Rank-000003.shard", "rank--000003.shard",
		"rank-000003-.shard", "rank-+00003.shard",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_msg(!ckpt_path_parse_shard(bad[i], &r, &id), "%s parsed", bad[i]);
	ck_assert(ckpt_path_parse_step_dir("step-18446744073709551615", &s));
	ck_assert_uint_eq(s, UINT64_MAX);
	ck_assert(!ckpt_path_parse_step_dir("step-18446744073709551616", &s));
	ck_assert(!ckpt_path_parse_step_dir("step-0000000000000000004x", &s));
	ck_assert(!ckpt_path_parse_step_dir("manifest", &s));
	ck_assert_int_eq(ckpt_path_step_dir(p, 10, "/r", 1), -ENAMETOOLONG);
}
END_TEST

/* Secret files: ssh's rule for private keys, the secret's bounds, and no wait on a
 * FIFO put in the file's place. */
START_TEST(secret_files)
{
	char *dir = tu_tmpdir("secret");
	char f[4200], fifo[4200];
	snprintf(f, sizeof f, "%s/s", dir);
	snprintf(fifo, sizeof fifo, "%s/fifo", dir);
	uint8_t out[8];
	size_t len = 0;
	unsigned mode = 0;
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -ENOENT);
	ck_assert_int_eq(tu_write_file(f, "abc\r\n", 5), 0);
	ck_assert_int_eq(chmod(f, 0644), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EPERM);
	ck_assert_uint_eq(mode, 0644);
	ck_assert_int_eq(chmod(f, 0620), 0);             /* others may write it: refused too */
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EPERM);
	ck_assert_int_eq(chmod(f, 0600), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), 0);
	ck_assert_uint_eq(len, 3);
	ck_assert_mem_eq(out, "abc", 3);
	/* Exactly max bytes, with or without a line end; an inner newline is the secret's. */
	ck_assert_int_eq(tu_write_file(f, "12\n45678\r\n", 10), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), 0);
	ck_assert_uint_eq(len, 8);
	ck_assert_mem_eq(out, "12\n45678", 8);
	ck_assert_int_eq(tu_write_file(f, "12345678", 8), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), 0);
	ck_assert_uint_eq(len, 8);
	/* One byte too many, or bytes after the line end, or nothing. */
	ck_assert_int_eq(tu_write_file(f, "123456789", 9), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EMSGSIZE);
	ck_assert_int_eq(tu_write_file(f, "12345678\nx", 10), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EMSGSIZE);
	ck_assert_int_eq(tu_write_file(f, "12345678\r\n\n", 11), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EMSGSIZE);
	ck_assert_int_eq(tu_write_file(f, "\r\n", 2), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EMSGSIZE);
	ck_assert_int_eq(tu_write_file(f, "", 0), 0);
	ck_assert_int_eq(ckpt_secret_file_read(f, out, sizeof out, &len, &mode), -EMSGSIZE);
	/* Not a regular file: refused at once (opening a FIFO to read would wait for a
	 * writer), and a directory likewise. */
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(ckpt_secret_file_read(fifo, out, sizeof out, &len, &mode), -EPERM);
	ck_assert_int_eq(ckpt_secret_file_read(dir, out, sizeof out, &len, &mode), -EPERM);
	tu_rmtree(dir);
	free(dir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("base");
	TCase *tc = tcase_create("base");
	tcase_add_test(tc, names);
	tcase_add_test(tc, names_utf8);
	tcase_add_test(tc, names_utf8_exhaustive);
	tcase_add_test(tc, sizes);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, fault_table);
	tcase_add_test(tc, alloc_failure);
	tcase_add_test(tc, cursor_and_buf);
	tcase_add_test(tc, paths);
	tcase_add_test(tc, secret_files);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
