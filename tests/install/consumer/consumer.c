/*
 * consumer.c — a program that uses an installed libckpt as its users do: only
 * <ckpt/ckpt.h> and the flags pkg-config or find_package(ckpt) give. It checks that
 * the library it runs with is the version its header names, then saves one tensor
 * as a job of one rank into ROOT and loads it back bit-exact.
 * Usage: consumer ROOT SEED. Exit 0 ok, 1 failure (said on stderr).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ckpt/ckpt.h>

#define STR_(x) #x
#define STR(x)  STR_(x)

static int fail(const char *what, int rc, const ckpt_ctx *c)
{
	fprintf(stderr, "consumer: %s: %s (%s)\n", what, ckpt_strerror(rc), ckpt_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: consumer ROOT SEED\n");
		return 1;
	}
	const char *want = STR(CKPT_VERSION_MAJOR) "." STR(CKPT_VERSION_MINOR) "."
	                   STR(CKPT_VERSION_PATCH);
	if (strcmp(ckpt_version(), want)) {
		fprintf(stderr, "consumer: ckpt_version() is '%s', the header says '%s'\n",
		        ckpt_version(), want);
		return 1;
	}

	enum { N = 3000 };
	static float data[N], back[N];
	uint64_t x = strtoull(argv[2], NULL, 0) | 1;
	for (size_t i = 0; i < N; i++) {   /* xorshift64: any seed, distinct bytes */
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		data[i] = (float)(x >> 40);
	}

	struct ckpt_opts o;
	ckpt_opts_init(&o, sizeof o);
	o.root = argv[1];
	o.rank = 0;
	o.world = 1;
	ckpt_ctx *c;
	int rc = ckpt_open(&o, &c);
	if (rc)
		return fail("ckpt_open", rc, NULL);

	uint64_t shape[1] = { N };
	struct ckpt_tensor t = {
		.name = "layer/w", .kind = CKPT_KIND_MODEL, .dtype = CKPT_F32,
		.policy = CKPT_SHARDED, .ndim = 1, .global_shape = shape, .data = data,
		.mem = CKPT_MEM_HOST,
	};
	ckpt_save *s;
	if ((rc = ckpt_save_begin(c, 1, &s)))
		return fail("ckpt_save_begin", rc, c);
	if (!(rc = ckpt_save_add_tensor(s, &t)) && !(rc = ckpt_save_submit(s)))
		rc = ckpt_save_wait(s, -1);
	ckpt_save_free(s);
	if (rc)
		return fail("save of step 1", rc, c);

	ckpt_load *l;
	if ((rc = ckpt_load_open(c, CKPT_LATEST, &l)))
		return fail("ckpt_load_open", rc, c);
	rc = ckpt_load_tensor(l, "layer/w", CKPT_F32, 1, NULL, NULL, back, CKPT_MEM_HOST);
	uint64_t step = ckpt_load_step(l);
	ckpt_load_close(l);
	if (rc)
		return fail("load of layer/w", rc, c);
	ckpt_close(c);
	if (step != 1 || memcmp(data, back, sizeof data)) {
		fprintf(stderr, "consumer: step %llu loaded, or its bytes differ from the saved\n",
		        (unsigned long long)step);
		return 1;
	}
	printf("consumer: libckpt %s: saved and loaded step 1 bit-exact\n", ckpt_version());
	return 0;
}
