/*
 * st_import.c — ckpt-reshard ROOT --import-safetensors PATH --step S: a committed
 * step made of the tensors of a safetensors file, or of a directory as Hugging Face
 * saves a model (model.safetensors.index.json naming the file of every tensor, or a
 * lone model.safetensors) — how a pretrained model comes into a checkpoint root.
 *
 * The input is untrusted and checked whole before anything is saved: the header
 * length against the file and the reference reader's cap, the header as strict JSON
 * (jansson: UTF-8, no duplicate keys, nothing after the object), every entry's
 * dtype, shape and offsets (shape times dtype size equal to the span, the spans
 * tiling the data exactly: no overlap, no gap, nothing past the end), and the
 * index's file names (plain names inside the directory, regular files, no link
 * followed) and its agreement with the files. Each kind of fault has its exit code
 * (reshard.h), and its message names the file and the tensor.
 *
 * Then the tensors are saved through the public API as a job of one rank, each
 * streamed from its file (ckpt_save_add_tensor_source with pread), so memory does
 * not grow with the model; the step is visible only once committed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reshard.h"
#include "st.h"
#include "toolutil.h"

struct in_file {
	char    *name;                /* as the messages say it */
	int      fd;
	uint64_t data;                /* where the data starts: 8 + header length */
	uint64_t size;
};

struct in_tensor {
	char    *name;                /* the name in the file */
	char    *ckpt;                /* the name in the checkpoint */
	int      dtype;
	unsigned ndim;
	uint64_t shape[CKPT_MAX_NDIM];
	uint64_t begin, end;          /* within the file's data */
	struct in_file *file;
};

struct in_set {
	struct in_file   *files;
	size_t            nfiles;
	struct in_tensor *t;
	size_t            n, cap;
};

static int begin_cmp(const void *x, const void *y)
{
	const struct in_tensor *a = *(struct in_tensor *const *)x, *b = *(struct in_tensor *const *)y;
	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	return a->end < b->end ? -1 : a->end > b->end;
}

/* A JSON string of the header around byte at, for a message: from the '"' before
 * it to the one after. */
static const char *around(const char *h, size_t len, size_t at, char *q, size_t cap)
{
	size_t b = at, e = at;
	while (b > 0 && h[b - 1] != '"')
		b--;
	while (e < len && h[e] != '"')
		e++;
	char tmp[512];
	size_t n = e - b < sizeof tmp - 1 ? e - b : sizeof tmp - 1;
	memcpy(tmp, h + b, n);
	tmp[n] = '\0';
	return tool_quote(tmp, q, cap);
}

/* The first byte of h[0, len) that is not part of well-formed UTF-8, or len. */
static size_t utf8_bad(const char *h, size_t len)
{
	/* tool_utf8_ok on growing prefixes would be quadratic: check per sequence. */
	size_t i = 0;
	while (i < len) {
		unsigned char c = (unsigned char)h[i];
		size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		if (!n || i + n > len || !c)
			return i;
		char seq[5] = { 0 };
		memcpy(seq, h + i, n);
		if (!tool_utf8_ok(seq))
			return i;
		i += n;
	}
	return len;
}

static bool get_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* One entry of the header: checked and appended to s. */
static int parse_entry(struct in_set *s, struct in_file *f, const char *key, json_t *v)
{
	char q[300];
	const char *tq = tool_quote(key, q, sizeof q);
	if (!json_is_object(v))
		return tool_fail(RX_TENSOR, CKPT_EFORMAT, "import: %s: tensor '%s': its entry is not "
		                 "an object", f->name, tq);
	json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
	       *of = json_object_get(v, "data_offsets");
	if (!dt || !sh || !of || json_object_size(v) != 3)
		return tool_fail(RX_TENSOR, CKPT_EFORMAT, "import: %s: tensor '%s': the entry must "
		                 "hold exactly dtype, shape and data_offsets", f->name, tq);
	if (s->n == s->cap) {
		size_t nc = s->cap ? 2 * s->cap : 64;
		struct in_tensor *nt = realloc(s->t, nc * sizeof *nt);
		if (!nt)
			return tool_fail(RX_FAIL, -ENOMEM, "import: %s: out of memory", f->name);
		s->t = nt;
		s->cap = nc;
	}
	struct in_tensor *t = &s->t[s->n];
	memset(t, 0, sizeof *t);
	t->file = f;
	t->dtype = json_is_string(dt) ? st_dtype_parse(json_string_value(dt)) : 0;
	if (!t->dtype)
		return tool_fail(RX_TENSOR, CKPT_EFORMAT, "import: %s: tensor '%s': dtype %s is not "
		                 "one of F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL",
		                 f->name, tq, json_is_string(dt) ? json_string_value(dt) : "(not a string)");
	if (!json_is_array(sh) || json_array_size(sh) > CKPT_MAX_NDIM)
		return tool_fail(RX_TENSOR, CKPT_ESHAPE, "import: %s: tensor '%s': shape is not an "
		                 "array of at most %d sizes", f->name, tq, CKPT_MAX_NDIM);
	t->ndim = (unsigned)json_array_size(sh);
	uint64_t bytes = ckpt_dtype_size(t->dtype);
	bool ovf = false;
	for (unsigned d = 0; d < t->ndim; d++) {
		if (!get_u64(json_array_get(sh, d), &t->shape[d]))
			return tool_fail(RX_TENSOR, CKPT_ESHAPE, "import: %s: tensor '%s': shape[%u] is "
			                 "not a size", f->name, tq, d);
		if (t->shape[d] && bytes > UINT64_MAX / t->shape[d])
			ovf = true;
		bytes *= t->shape[d];
	}
	if (!json_is_array(of) || json_array_size(of) != 2 ||
	    !get_u64(json_array_get(of, 0), &t->begin) || !get_u64(json_array_get(of, 1), &t->end) ||
	    t->end < t->begin)
		return tool_fail(RX_OFFSETS, CKPT_EFORMAT, "import: %s: tensor '%s': data_offsets is "
		                 "not [begin, end] with begin <= end", f->name, tq);
	if (ovf || bytes != t->end - t->begin)
		return tool_fail(RX_TENSOR, CKPT_ESHAPE, "import: %s: tensor '%s': its shape and "
		                 "dtype %s make %s bytes, its offsets span %" PRIu64, f->name, tq,
		                 st_dtype_name(t->dtype), ovf ? "more than 2^64" : "a different number of",
		                 t->end - t->begin);
	if (t->end > f->size - f->data)
		return tool_fail(RX_OFFSETS, CKPT_EFORMAT, "import: %s: tensor '%s': data_offsets end "
		                 "at %" PRIu64 ", past the %" PRIu64 " bytes of data", f->name, tq, t->end,
		                 f->size - f->data);
	if (!(t->name = strdup(key)))
		return tool_fail(RX_FAIL, -ENOMEM, "import: %s: out of memory", f->name);
	s->n++;
	return 0;
}

/* Read and check the header of f (open, f->name set); append its tensors to s. */
static int parse_file(struct in_set *s, struct in_file *f)
{
	struct stat st;
	if (fstat(f->fd, &st) < 0)
		return tool_fail(RX_FAIL, -errno, "import: %s: %s", f->name, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: not a regular file", f->name);
	f->size = (uint64_t)st.st_size;
	uint8_t le[8];
	if (f->size < 8 || pread(f->fd, le, 8, 0) != 8)
		return tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: shorter than the 8 bytes of "
		                 "the header length", f->name);
	uint64_t hlen = 0;
	for (int b = 0; b < 8; b++)
		hlen |= (uint64_t)le[b] << (8 * b);
	if (hlen > ST_MAX_HEADER || hlen > f->size - 8 || hlen < 2)
		return tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: header length %" PRIu64 " does "
		                 "not fit: the file holds %" PRIu64 " bytes after it, and a header is "
		                 "2 to %u bytes", f->name, hlen, f->size - 8, ST_MAX_HEADER);
	f->data = 8 + hlen;
	char *h = malloc((size_t)hlen + 1);
	if (!h)
		return tool_fail(RX_FAIL, -ENOMEM, "import: %s: out of memory for its header", f->name);
	ssize_t got = pread(f->fd, h, (size_t)hlen, 8);
	if (got != (ssize_t)hlen) {
		free(h);
		return tool_fail(RX_FAIL, -EIO, "import: %s: short read of the header", f->name);
	}
	h[hlen] = '\0';
	char q[300];
	size_t bad = utf8_bad(h, (size_t)hlen);
	if (bad < hlen) {
		int x = tool_fail(RX_NAME, CKPT_ENAME, "import: %s: the header is not UTF-8 at byte "
		                  "%zu, in '%s' (a JSON header, and names, must be)", f->name, bad,
		                  around(h, (size_t)hlen, bad, q, sizeof q));
		free(h);
		return x;
	}
	json_error_t je;
	json_t *root = json_loadb(h, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
	free(h);
	if (!root)
		return tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: the header is not valid JSON at "
		                 "byte %d: %s", f->name, je.position, je.text);
	int x = 0;
	if (!json_is_object(root))
		x = tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: the header is not a JSON object",
		              f->name);
	size_t first = s->n;
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v) {
		if (x)
			break;
		if (!strcmp(k, "__metadata__")) {
			const char *mk;
			json_t *mv;
			if (!json_is_object(v))
				x = tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: __metadata__ is not an "
				              "object", f->name);
			json_object_foreach(v, mk, mv) {
				if (!x && !json_is_string(mv))
					x = tool_fail(RX_HEADER, CKPT_EFORMAT, "import: %s: __metadata__ '%s' is "
					              "not a string", f->name, tool_quote(mk, q, sizeof q));
			}
			continue;
		}
		x = parse_entry(s, f, k, v);
	}
	json_decref(root);
	if (x)
		return x;
	/* The spans must tile the data: sorted by begin, each starts where the last
	 * ended, from 0 to the end of the file. */
	size_t n = s->n - first;
	struct in_tensor **o = calloc(n + 1, sizeof *o);
	if (!o)
		return tool_fail(RX_FAIL, -ENOMEM, "import: %s: out of memory", f->name);
	for (size_t i = 0; i < n; i++)
		o[i] = &s->t[first + i];
	qsort(o, n, sizeof *o, begin_cmp);
	uint64_t at = 0;
	char q2[300];
	for (size_t i = 0; !x && i < n; i++) {
		if (o[i]->begin < at)
			x = tool_fail(RX_OFFSETS, CKPT_EFORMAT, "import: %s: tensors '%s' and '%s' "
			              "overlap at data offset %" PRIu64, f->name,
			              tool_quote(o[i - 1]->name, q, sizeof q),
			              tool_quote(o[i]->name, q2, sizeof q2), o[i]->begin);
		else if (o[i]->begin > at)
			x = tool_fail(RX_OFFSETS, CKPT_EFORMAT, "import: %s: tensor '%s' starts at data "
			              "offset %" PRIu64 ", leaving a gap after %" PRIu64, f->name,
			              tool_quote(o[i]->name, q, sizeof q), o[i]->begin, at);
		at = o[i]->end;
	}
	if (!x && at != f->size - f->data)
		x = tool_fail(RX_OFFSETS, CKPT_EFORMAT, "import: %s: %" PRIu64 " bytes of data after "
		              "the last tensor's end (%" PRIu64 ")", f->name, f->size - f->data - at, at);
	free(o);
	return x;
}

static int add_file(struct in_set *s, int dfd, const char *dir, const char *name)
{
	struct in_file *f = &s->files[s->nfiles];
	f->fd = -1;
	if (dir ? asprintf(&f->name, "%s/%s", dir, name) < 0 : !(f->name = strdup(name)))
		return tool_fail(RX_FAIL, -ENOMEM, "import: out of memory");
	s->nfiles++;
	/* O_NOFOLLOW: a link could lead outside the directory the index is in. */
	f->fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | (dir ? O_NOFOLLOW : 0));
	if (f->fd < 0)
		return tool_fail(dir ? RX_INDEX : RX_NOTROOT, -errno, "import: %s: %s", f->name,
		                 errno == ELOOP ? "a symbolic link (not followed in a model "
		                 "directory)" : strerror(errno));
	return parse_file(s, f);
}

static int name_cmp(const void *x, const void *y)
{
	return strcmp(((const struct in_tensor *)x)->name, ((const struct in_tensor *)y)->name);
}

/* A directory with model.safetensors.index.json: every file it names, and each
 * tensor where it says. */
static int read_index(struct in_set *s, int dfd, const char *dir)
{
	int fd = openat(dfd, "model.safetensors.index.json", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		if (errno != ENOENT)
			return tool_fail(RX_INDEX, -errno, "import: %s/model.safetensors.index.json: %s",
			                 dir, strerror(errno));
		if (faccessat(dfd, "model.safetensors", F_OK, AT_SYMLINK_NOFOLLOW) < 0 &&
		    errno == ENOENT)
			return tool_fail(RX_INDEX, -ENOENT, "import: %s holds neither "
			                 "model.safetensors.index.json nor model.safetensors", dir);
		s->files = calloc(1, sizeof *s->files);
		if (!s->files)
			return tool_fail(RX_FAIL, -ENOMEM, "import: out of memory");
		return add_file(s, dfd, dir, "model.safetensors");
	}
	json_error_t je;
	json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	close(fd);
	if (!root)
		return tool_fail(RX_INDEX, CKPT_EFORMAT, "import: %s/model.safetensors.index.json: "
		                 "line %d: %s", dir, je.line, je.text);
	json_t *wm = json_object_get(root, "weight_map"), *md = json_object_get(root, "metadata");
	int x = 0;
	char q[300], q2[300];
	if (!json_is_object(root) || !json_is_object(wm) || (md && !json_is_object(md)))
		x = tool_fail(RX_INDEX, CKPT_EFORMAT, "import: %s/model.safetensors.index.json: not "
		              "{\"metadata\": {...}, \"weight_map\": {tensor: file}}", dir);
	size_t nw = x ? 0 : json_object_size(wm);
	const char **fn = calloc(nw + 1, sizeof *fn);
	s->files = calloc(nw + 1, sizeof *s->files);
	if (!x && (!fn || !s->files))
		x = tool_fail(RX_FAIL, -ENOMEM, "import: out of memory");
	size_t nfn = 0;
	const char *k;
	json_t *v;
	if (!x) {
		json_object_foreach(wm, k, v) {
			const char *f = json_is_string(v) ? json_string_value(v) : NULL;
			/* A plain name: the index must not reach outside its directory. */
			if (!f || !f[0] || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, "..")) {
				x = tool_fail(RX_INDEX, CKPT_EFORMAT, "import: %s/model.safetensors.index.json: "
				              "tensor '%s': file '%s' is not a plain file name in the directory",
				              dir, tool_quote(k, q, sizeof q),
				              f ? tool_quote(f, q2, sizeof q2) : "(not a string)");
				break;
			}
			size_t j = 0;
			while (j < nfn && strcmp(fn[j], f))
				j++;
			if (j == nfn)
				fn[nfn++] = f;
		}
	}
	for (size_t j = 0; !x && j < nfn; j++)
		x = add_file(s, dfd, dir, fn[j]);
	/* Every tensor of every file is in the index, in that file, and every entry of
	 * the index is in its file; a tensor in two files is refused. */
	if (!x)
		qsort(s->t, s->n, sizeof *s->t, name_cmp);
	for (size_t i = 0; !x && i < s->n; i++) {
		const struct in_tensor *t = &s->t[i];
		json_t *e = json_object_get(wm, t->name);
		const char *want = json_is_string(e) ? json_string_value(e) : NULL;
		if (i && !strcmp(s->t[i - 1].name, t->name))
			x = tool_fail(RX_INDEX, CKPT_EFORMAT, "import: tensor '%s' is in both %s and %s",
			              tool_quote(t->name, q, sizeof q), s->t[i - 1].file->name, t->file->name);
		else if (!want || strcmp(want, strrchr(t->file->name, '/') + 1))
			x = tool_fail(RX_INDEX, CKPT_EFORMAT, "import: %s: tensor '%s' is not in the index "
			              "under that file", t->file->name, tool_quote(t->name, q, sizeof q));
	}
	if (!x && s->n != nw) {
		json_object_foreach(wm, k, v) {
			struct in_tensor key = { .name = (char *)k };
			if (!bsearch(&key, s->t, s->n, sizeof key, name_cmp)) {
				x = tool_fail(RX_INDEX, CKPT_EFORMAT, "import: %s/model.safetensors.index.json: "
				              "tensor '%s' is not in %s", dir, tool_quote(k, q, sizeof q),
				              json_string_value(v));
				break;
			}
		}
	}
	free(fn);
	json_decref(root);
	return x;
}

/* ckpt_source_fn: bytes [off, off + len) of the tensor, from its file. */
static int fill(void *arg, uint64_t off, void *dst, size_t len)
{
	const struct in_tensor *t = arg;
	uint64_t at = t->file->data + t->begin + off;
	uint8_t *p = dst;
	while (len) {
		ssize_t n = pread(t->file->fd, p, len, (off_t)at);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;   /* the file shrank since it was checked */
		p += n;
		at += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

static int ckpt_cmp(const void *x, const void *y)
{
	return strcmp(((const struct in_tensor *)x)->ckpt, ((const struct in_tensor *)y)->ckpt);
}

int reshard_import_safetensors(const struct reshard_args *a)
{
	struct in_set s = { 0 };
	struct st_namemap map = { 0 };
	ckpt_ctx *c = NULL;
	ckpt_save *sv = NULL;
	char q[300], q2[300];
	const char *path = a->import_path;
	int x = a->name_map ? st_namemap_load(a->name_map, true, &map) : 0;
	if (x)
		goto out;
	struct stat st;
	if (stat(path, &st) < 0) {
		x = tool_fail(RX_NOTROOT, -errno, "import: %s: %s", path, strerror(errno));
		goto out;
	}
	if (S_ISDIR(st.st_mode)) {
		int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0) {
			x = tool_fail(RX_NOTROOT, -errno, "import: %s: %s", path, strerror(errno));
			goto out;
		}
		x = read_index(&s, dfd, path);
		close(dfd);
	} else {
		if (!(s.files = calloc(1, sizeof *s.files))) {
			x = tool_fail(RX_FAIL, -ENOMEM, "import: out of memory");
			goto out;
		}
		x = add_file(&s, AT_FDCWD, NULL, path);
	}
	if (x)
		goto out;
	for (size_t i = 0; i < s.n; i++) {
		struct in_tensor *t = &s.t[i];
		const char *m = st_namemap_get(&map, true, t->name);
		t->ckpt = m ? strdup(m) : st_import_name(t->name);
		if (!t->ckpt) {
			x = tool_fail(RX_FAIL, -ENOMEM, "import: out of memory");
			goto out;
		}
		if (ckpt_name_check(t->ckpt, strlen(t->ckpt))) {
			x = tool_fail(RX_NAME, CKPT_ENAME, "import: %s: tensor '%s': '%s' is not a valid "
			              "checkpoint name (docs/api.md, ckpt_name_check)", t->file->name,
			              tool_quote(t->name, q, sizeof q), tool_quote(t->ckpt, q2, sizeof q2));
			goto out;
		}
	}
	qsort(s.t, s.n, sizeof *s.t, ckpt_cmp);
	for (size_t i = 1; i < s.n; i++) {
		if (strcmp(s.t[i - 1].ckpt, s.t[i].ckpt))
			continue;
		x = tool_fail(RX_NAME, CKPT_ENAME, "import: tensors '%s' and '%s' would both be named "
		              "'%s' in the checkpoint", tool_quote(s.t[i - 1].name, q, sizeof q),
		              tool_quote(s.t[i].name, q2, sizeof q2), s.t[i].ckpt);
		goto out;
	}
	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = a->root;
	o.manifest_dir = a->manifest_dir;
	o.rank = 0;
	o.world = 1;
	o.pool_bytes = a->pool;
	o.chunk_bytes = a->chunk;
	o.zstd_level = a->zstd_level;
	o.compress_codec = a->compress_codec;
	int rc = ckpt_open(&o, &c);
	if (!rc)
		rc = ckpt_save_begin(c, a->out_step, &sv);
	double t0 = tool_now();
	uint64_t bytes = 0;
	for (size_t i = 0; !rc && i < s.n; i++) {
		const struct in_tensor *t = &s.t[i];
		/* Replicated: the whole value, which every rank of a later job loads (any box
		 * of it, whatever that job's world). */
		struct ckpt_tensor ct = {
			.name = t->ckpt, .kind = CKPT_KIND_MODEL, .dtype = t->dtype,
			.policy = CKPT_REPLICATED, .ndim = t->ndim, .global_shape = t->shape,
			.mem = CKPT_MEM_HOST,
		};
		rc = ckpt_save_add_tensor_source(sv, &ct, fill, (void *)t);
		bytes += t->end - t->begin;
	}
	if (!rc)
		rc = ckpt_save_submit(sv);
	if (!rc)
		rc = ckpt_save_wait(sv, -1);
	if (rc) {
		x = tool_fail(reshard_exit_for(rc), rc, "import into %s step %" PRIu64 ": %s", a->root,
		              a->out_step, ckpt_last_error());
		goto out;
	}
	double dt = tool_now() - t0;
	char b1[32];
	if (a->json) {
		printf("{\"op\":\"import\",\"ok\":true,\"root\":");
		tool_json_str(stdout, a->root);
		printf(",\"step\":%" PRIu64 ",\"files\":%zu,\"tensors\":%zu,\"bytes\":%" PRIu64
		       ",\"seconds\":%.6f}\n", a->out_step, s.nfiles, s.n, bytes, dt);
	} else {
		printf("imported %zu tensors, %s from %zu file(s) into %s step %" PRIu64 " in %.3f s\n",
		       s.n, tool_bytes(bytes, b1), s.nfiles, a->root, a->out_step, dt);
	}
out:
	ckpt_save_free(sv);
	ckpt_close(c);
	for (size_t i = 0; i < s.n; i++) {
		free(s.t[i].name);
		free(s.t[i].ckpt);
	}
	for (size_t i = 0; i < s.nfiles; i++) {
		free(s.files[i].name);
		if (s.files[i].fd >= 0)
			close(s.files[i].fd);
	}
	free(s.t);
	free(s.files);
	st_namemap_free(&map);
	return x;
}
