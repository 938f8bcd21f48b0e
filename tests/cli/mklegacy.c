/*
 * mklegacy.c — ckpt-test-mklegacy ROOT STEP: make ROOT hold committed step STEP with
 * tensor names that are not UTF-8, as a checkpoint saved before the library required
 * UTF-8 names may (tests/api/legacy_root.h says how), for the CLI tests of what the
 * tools print for such names. Exit 0, or 1 with the reason on stderr.
 */
#include <stdio.h>
#include <stdlib.h>

#include "legacy_root.h"

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: ckpt-test-mklegacy ROOT STEP\n");
		return 2;
	}
	char *end;
	unsigned long long step = strtoull(argv[2], &end, 10);
	if (*end || end == argv[2]) {
		fprintf(stderr, "ckpt-test-mklegacy: '%s' is not a step\n", argv[2]);
		return 2;
	}
	return legacy_root_make(argv[1], step) ? 1 : 0;
}
