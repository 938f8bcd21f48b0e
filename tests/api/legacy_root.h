/*
 * legacy_root.h — a checkpoint root as an older libckpt could leave it: tensor names
 * that are not well-formed UTF-8, which the save API refuses today but a committed
 * checkpoint may still hold. Used by test_names (loading by such names) and by the
 * CLI tests (tools printing them), through tests/cli/mklegacy.c.
 */
#ifndef CKPT_TEST_LEGACY_ROOT_H
#define CKPT_TEST_LEGACY_ROOT_H

#include <stddef.h>
#include <stdint.h>

/* The names of a legacy root: each breaks only the UTF-8 rule. */
extern const char *const legacy_bad_names[];
extern const size_t legacy_nbad;
/* Saved beside them: a multi-byte name and a plain one. */
#define LEGACY_GOOD_UTF8 "ok/\xce\xb1\xce\xb2/\xe6\x97\xa5/\xf0\x9f\x98\x80"
#define LEGACY_PLAIN     "ok/plain"
/* Every tensor is f32 of LEGACY_ELEMS elements, legacy_fill(i) for the i-th bad name,
 * legacy_fill(legacy_nbad) and legacy_fill(legacy_nbad + 1) for the two others. */
#define LEGACY_ELEMS 1000u
void legacy_fill(float *dst, size_t which);

/*
 * Make root (created if missing) hold committed step `step`, world 1, with those
 * tensors: saved through the public API under placeholder names of the same lengths,
 * then the shard's footer rewritten with the real names (footer hash and trailer
 * hash recomputed), the manifest removed and rebuilt from the shard
 * (ckpt_catalog_rebuild), as an operator would after losing it. 0, or a negative
 * code with the reason on stderr.
 */
int legacy_root_make(const char *root, uint64_t step);

#endif
