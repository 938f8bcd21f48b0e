/*
 * testutil.h — helpers shared by the test programs: temporary roots, seeded data,
 * recursive removal, and running a child process.
 */
#ifndef CKPT_TESTUTIL_H
#define CKPT_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A fresh directory under $TMPDIR (or /var/tmp: a real disk, so O_DIRECT works).
 * Returns a malloc'd path; aborts the test on failure. */
char *tu_tmpdir(const char *tag);
/* rm -rf path (used on success; failed tests keep their root for inspection). */
void tu_rmtree(const char *path);
/* A TCP port on 127.0.0.1 that nobody listens on now (the kernel's choice; the race
 * until a coordinator binds it shows as a failed connect, never as a wrong result).
 * Aborts the test when no socket can be had. */
unsigned tu_free_port(void);
/* The run's seed: CKPT_TEST_SEED or time-based, printed once to stderr. */
uint64_t tu_seed(void);
/* Deterministic bytes from (seed, stream). */
void tu_fill(void *p, size_t n, uint64_t seed, uint64_t stream);
/* splitmix64 step. */
uint64_t tu_rand(uint64_t *state);
/* Read a whole file (malloc'd) / write one. -errno. */
int tu_read_file(const char *path, void **out, size_t *len);
int tu_write_file(const char *path, const void *p, size_t len);
/* Flip one bit of a file at byte offset off. -errno. */
int tu_flip_bit(const char *path, uint64_t off, int bit);
/* Count regular files below path. */
int tu_count_files(const char *path);
/* The path of rank's shard file of step in root (its name carries the attempt's save
 * id, which a test does not know): 0, or -ENOENT when there is none (-EEXIST: more
 * than one). */
int tu_shard_path(const char *root, uint64_t step, uint32_t rank, char *out, size_t cap);
/* Lines of s (log text) holding needle. */
unsigned tu_count_lines(const char *s, const char *needle);
/* The sum of N over the lines "<what>: N similar messages suppressed" of s. */
unsigned long long tu_sum_suppressed(const char *s, const char *what);
/* Whether p[0..n) is well-formed UTF-8, by decoding each code point and checking
 * its range: written independently of the library's byte table, so that the two
 * check each other. */
bool tu_utf8_ok(const unsigned char *p, size_t n);

/* A gate that holds a save in flight: tu_gate_source is a tensor source
 * (ckpt_source_fn) whose first call says it was entered and then blocks until
 * tu_gate_release; it fills its bytes with 0x5a. Aborts the test on a pipe error. */
struct tu_gate { int go[2]; int entered[2]; };
void tu_gate_init(struct tu_gate *g);
int  tu_gate_source(void *arg, uint64_t off, void *dst, size_t len);
void tu_gate_wait_entered(struct tu_gate *g);   /* the save worker is inside */
void tu_gate_release(struct tu_gate *g);
void tu_gate_close(struct tu_gate *g);

#endif
