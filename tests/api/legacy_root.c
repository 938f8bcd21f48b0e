/*
 * legacy_root.c — see legacy_root.h. The save API no longer writes names that are
 * not UTF-8, so the shard is written with placeholders and its footer rewritten
 * here: the same bytes an older writer produced, down to the hashes a reader checks
 * (footer hash in the trailer, the trailer's own hash, docs/format.md §3, §4).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ckpt/catalog.h"
#include "ckpt/ckpt.h"
#include "io/io_internal.h"
#include "legacy_root.h"
#include "testutil.h"

const char *const legacy_bad_names[] = {
	"legacy/overlong-\xc0\xaf",             /* '/' in two bytes */
	"legacy/surrogate-\xed\xa0\x80",        /* U+D800 */
	"legacy/above-\xf4\x90\x80\x80",        /* U+110000 */
	"legacy/truncated-\xe2\x82",            /* the euro sign without its last byte */
	"legacy/continuation-\x80",             /* a lone continuation byte */
};
const size_t legacy_nbad = sizeof legacy_bad_names / sizeof *legacy_bad_names;

void legacy_fill(float *dst, size_t which)
{
	for (size_t k = 0; k < LEGACY_ELEMS; k++)
		dst[k] = (float)(which * 10000 + k) * 0.5f;
}

/* The same length in ASCII: every byte >= 0x80 becomes 'Q'. */
static void placeholder(const char *name, char *out)
{
	size_t n = strlen(name);
	for (size_t k = 0; k < n; k++)
		out[k] = (unsigned char)name[k] >= 0x80 ? 'Q' : name[k];
	out[n] = '\0';
}

static int save_placeholders(const char *root, uint64_t step)
{
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.zstd_level = 0;
	ckpt_ctx *c = NULL;
	ckpt_save *s = NULL;
	float *data = calloc((legacy_nbad + 2) * LEGACY_ELEMS, sizeof *data);
	char (*names)[128] = calloc(legacy_nbad + 2, sizeof *names);
	int rc = data && names ? ckpt_open(&o, &c) : -ENOMEM;
	if (!rc)
		rc = ckpt_save_begin(c, step, &s);
	uint64_t shape[1] = { LEGACY_ELEMS };
	for (size_t i = 0; !rc && i < legacy_nbad + 2; i++) {
		if (i < legacy_nbad)
			placeholder(legacy_bad_names[i], names[i]);
		else
			snprintf(names[i], sizeof names[i], "%s",
			         i == legacy_nbad ? LEGACY_GOOD_UTF8 : LEGACY_PLAIN);
		legacy_fill(data + i * LEGACY_ELEMS, i);
		struct ckpt_tensor t = { .name = names[i], .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		                         .policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape,
		                         .data = data + i * LEGACY_ELEMS, .mem = CKPT_MEM_HOST };
		rc = ckpt_save_add_tensor(s, &t);
	}
	if (!rc)
		rc = ckpt_save_submit(s);
	if (!rc)
		rc = ckpt_save_wait(s, -1);
	if (rc)
		fprintf(stderr, "legacy root: save: %s\n", ckpt_last_error());
	ckpt_save_free(s);
	ckpt_close(c);
	free(data);
	free(names);
	return rc;
}

/* Put the real names into the footer of the shard at path, and the hashes that
 * cover it back in order. */
static int rewrite_footer(const char *path)
{
	void *buf;
	size_t len;
	int rc = tu_read_file(path, &buf, &len);
	if (rc)
		return rc;
	if (len < IO_HEADER_BYTES + IO_TRAILER_BYTES) {
		fprintf(stderr, "legacy root: %s: truncated\n", path);
		free(buf);
		return CKPT_EFORMAT;
	}
	uint8_t *f = buf, *t = f + len - IO_TRAILER_BYTES;
	uint64_t foff = ckpt_get_le64(t + IO_TRL_OFF_FOOTER), flen = ckpt_get_le64(t + IO_TRL_OFF_FLEN);
	if (foff > len || flen > len - foff) {
		fprintf(stderr, "legacy root: %s: footer outside the file\n", path);
		free(buf);
		return CKPT_EFORMAT;
	}
	for (size_t i = 0; i < legacy_nbad; i++) {
		/* The record: name_len (le16), then the name. */
		size_t n = strlen(legacy_bad_names[i]);
		uint8_t want[2 + 128];
		ckpt_put_le16(want, (uint16_t)n);
		placeholder(legacy_bad_names[i], (char *)want + 2);
		uint8_t *at = memmem(f + foff, (size_t)flen, want, n + 2);
		if (!at) {
			fprintf(stderr, "legacy root: %s: no record of '%s'\n", path, (char *)want + 2);
			free(buf);
			return CKPT_EFORMAT;
		}
		memcpy(at + 2, legacy_bad_names[i], n);
	}
	io_hash128(f + foff, (size_t)flen, t + IO_TRL_OFF_FHASH);
	ckpt_put_le64(t + IO_TRL_HASHED, XXH3_64bits(t, IO_TRL_HASHED));
	rc = tu_write_file(path, buf, len);
	free(buf);
	return rc;
}

int legacy_root_make(const char *root, uint64_t step)
{
	int rc = save_placeholders(root, step);
	if (rc)
		return rc;
	char path[4096];
	if ((rc = tu_shard_path(root, step, 0, path, sizeof path)) || (rc = rewrite_footer(path)))
		return rc;
	/* The manifest named the old footer by its hash: rebuild it from the shard. */
	snprintf(path, sizeof path, "%s/%s", root, CKPT_MANIFEST_NAME);
	tu_rmtree(path);
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = root;
	o.rank = 0;
	o.world = 1;
	o.flags = CKPT_OPEN_RECOVER;
	ckpt_ctx *c = NULL;
	struct ckpt_rebuild_result r = { .size = sizeof r };
	rc = ckpt_open(&o, &c);
	if (!rc)
		rc = ckpt_catalog_rebuild(c, 0, NULL, NULL, &r);
	if (!rc && r.steps_committed != 1)
		rc = CKPT_EINVALID;
	if (rc)
		fprintf(stderr, "legacy root: rebuild: %s (%llu committed)\n", ckpt_last_error(),
		        (unsigned long long)r.steps_committed);
	ckpt_close(c);
	return rc;
}
