/*
 * ckpt-reshard — rewrite a committed checkpoint for another number of ranks, or
 * export its consolidated tensors to safetensors; public API only:
 *
 *   ckpt-reshard ROOT STEP|latest --world N --out ROOT2 [--step S2] [--chunk SIZE]
 *                [--compress none|zstd[:L]|bytegroup[:L]] [--pool SIZE] [--rank-map LIST |
 *                --drop-rank-bound] [--port P] [--quiet] [--json]
 *   ckpt-reshard ROOT STEP|latest --export-safetensors DIR [--max-shard-size SIZE]
 *                [--kind LIST] [--name-map FILE] [--dtype bf16|fp16|fp32]
 *                [--buffer SIZE] [--quiet] [--json]
 *   ckpt-reshard ROOT --import-safetensors PATH --step S [--name-map FILE]
 *                [--chunk SIZE] [--compress C] [--pool SIZE] [--quiet] [--json]
 *
 * Each form takes --manifest-dir MDIR, ROOT's manifest directory when it is kept
 * apart from the root; the reshard also --out-manifest-dir MDIR2, ROOT2's.
 *
 * Writing N shard files means N ranks saving: the tool forks N rank processes (rank
 * r of world N, the environment a launcher would give), each of which loads its new
 * box of every sharded tensor from the source — resharding is a property of load —
 * and saves it; rank 0 is the commit coordinator, exactly as in a training job. So
 * the output is a checkpoint like any other, committed only when every new rank's
 * shard is durable. Replicated items are saved once (by new rank 0); rank-bound
 * items only with an explicit map (--rank-map) or dropped (--drop-rank-bound).
 *
 * Memory: a rank process pulls its share from the source while the new shard is
 * written (a source callback, with a read-ahead thread), so its bound is two pools
 * (source reads, output), the read-ahead ring and a chunk of scratch, whatever its
 * share. docs/ckpt-reshard.md says so.
 *
 * Every option value is parsed strictly (toolutil.h); under --json stdout holds one
 * JSON object whatever happens.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard.h"
#include "st.h"
#include "toolutil.h"

static void usage(FILE *f)
{
	fprintf(f,
	"usage: ckpt-reshard ROOT STEP|latest --world N --out ROOT2 [--step S2] [--chunk SIZE]\n"
	"                    [--compress none|zstd[:L]|bytegroup[:L]] [--pool SIZE]\n"
	"                    [--rank-map LIST | --drop-rank-bound] [--port P]\n"
	"                    [--manifest-dir MDIR] [--out-manifest-dir MDIR2] [--quiet] [--json]\n"
	"       ckpt-reshard ROOT STEP|latest --export-safetensors DIR [--max-shard-size SIZE]\n"
	"                    [--kind LIST] [--name-map FILE] [--dtype bf16|fp16|fp32]\n"
	"                    [--buffer SIZE] [--manifest-dir MDIR] [--quiet] [--json]\n"
	"       ckpt-reshard ROOT --import-safetensors PATH --step S [--name-map FILE]\n"
	"                    [--chunk SIZE] [--compress C] [--pool SIZE] [--manifest-dir MDIR]\n"
	"                    [--quiet] [--json]\n"
	"\n"
	"  --world N              new number of ranks; every sharded tensor is split evenly\n"
	"                         along its first dimension (one shard file per new rank)\n"
	"  --out ROOT2            output checkpoint root (another root than ROOT)\n"
	"  --step S2              step number in ROOT2 (default: the source step); the step\n"
	"                         to create with --import-safetensors (required there)\n"
	"  --chunk SIZE           chunk size of the output (default: the source's largest chunk,\n"
	"                         so that the same bytes keep the same chunk hashes)\n"
	"  --compress C           none (default), zstd[:LEVEL] or bytegroup[:LEVEL]\n"
	"  --pool SIZE            staging pool of each rank process, for its output and for its\n"
	"                         source reads (library default); the read-ahead holds two\n"
	"                         windows of half of it (16 to 128 MiB each)\n"
	"  --rank-map LIST        N comma-separated saved ranks: new rank i takes the rank-bound\n"
	"                         items (RNG state, data position) of saved rank LIST[i]; '-' for none\n"
	"  --drop-rank-bound      leave rank-bound items out of the output\n"
	"  --port P               commit coordinator port for the N rank processes (default: a\n"
	"                         free one)\n"
	"  --export-safetensors DIR  write the consolidated tensors as Hugging Face does:\n"
	"                         model.safetensors or model-0000i-of-0000N.safetensors, and\n"
	"                         model.safetensors.index.json\n"
	"  --max-shard-size SIZE  data per file, Hugging Face units: 5GB (default), 500MB,\n"
	"                         10KiB, or bytes; a larger tensor gets a file of its own\n"
	"  --kind LIST            kinds to export, comma-separated: model (default), optimizer,\n"
	"                         rng, scheduler, extra, or all\n"
	"  --name-map FILE        JSON object {checkpoint name: Hugging Face name}; wins over\n"
	"                         the rule (drop a model tensor's \"model/\", then '/' -> '.');\n"
	"                         read backwards by --import-safetensors\n"
	"  --dtype T              cast floating tensors to bf16, fp16 or fp32 (nearest, ties\n"
	"                         to even); others are written as they are\n"
	"  --import-safetensors PATH  create step --step in ROOT from a safetensors file or a\n"
	"                         Hugging Face model directory (tensors become model/NAME)\n"
	"  --buffer SIZE          export read buffer (default 64M; at least one row of a tensor)\n"
	"  --manifest-dir MDIR    ROOT's manifest directory, when it is kept apart from the\n"
	"                         root (an absolute path; default: CKPT_MANIFEST_DIR, then\n"
	"                         ROOT/manifest)\n"
	"  --out-manifest-dir MDIR2  ROOT2's, the same way (with CKPT_MANIFEST_DIR set, give\n"
	"                         it: two roots never share one manifest directory)\n"
	"  --quiet                no progress display\n"
	"  --json                 one JSON document on stdout, also on failure\n"
	"  --help                 this text\n"
	"  --version              print the version and exit\n"
	"SIZE takes K, M, G, T suffixes.\n"
	"\n"
	"exit status: 0 ok; 1 failure; 2 usage; 3 no such step; 4 not a checkpoint root;\n"
	"5 the output root already holds the step; 6 N does not fit a tensor's first\n"
	"dimension; 7 rank-bound items without --rank-map or --drop-rank-bound; 8 saving with\n"
	"N ranks is not available in this build; safetensors: 9 header, 10 tensor entry,\n"
	"11 offsets, 12 index, 13 names. See docs/ckpt-reshard.md.\n");
}

static int parse_rank_map(struct reshard_args *a, const char *s)
{
	size_t n = 1;
	for (const char *q = s; *q; q++)
		n += *q == ',';
	a->rank_map = calloc(n, sizeof *a->rank_map);
	if (!a->rank_map)
		return -1;
	char *dup = strdup(s), *save = NULL;
	size_t i = 0;
	if (!dup)
		return -1;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++) {
		uint64_t v;
		if (!strcmp(tok, "-"))
			a->rank_map[i] = -1;
		else if (tool_parse_u64(tok, &v) || v > INT_MAX) {
			free(dup);
			return -1;
		} else
			a->rank_map[i] = (int)v;
	}
	free(dup);
	return i == n ? (int)n : -1;
}

/* --kind LIST: comma-separated kind names, or "all". 0 or -1. */
static int parse_kinds(struct reshard_args *a, const char *s)
{
	static const char *kinds[] = { "model", "optimizer", "rng", "scheduler", "extra" };
	a->kinds = 0;
	if (!strcmp(s, "all")) {
		for (int k = 0; k < 5; k++)
			a->kinds |= 1u << (k + 1);
		return 0;
	}
	const char *p = s;
	for (;;) {
		size_t len = strcspn(p, ",");
		int found = 0;
		for (int k = 0; k < 5; k++)
			if (strlen(kinds[k]) == len && !strncmp(p, kinds[k], len))
				found = k + 1;
		if (!found)
			return -1;
		a->kinds |= 1u << found;
		if (!p[len])
			return 0;
		p += len + 1;
	}
}

int main(int argc, char **argv)
{
	tool_init("ckpt-reshard", NULL);
	tool_version(argc, argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return RX_OK;
		}
	}
	struct reshard_args a;
	memset(&a, 0, sizeof a);
	static const struct option opts[] = {
		{ "world", required_argument, 0, 'w' }, { "out", required_argument, 0, 'o' },
		{ "step", required_argument, 0, 's' }, { "chunk", required_argument, 0, 'C' },
		{ "compress", required_argument, 0, 'c' }, { "pool", required_argument, 0, 'P' },
		{ "rank-map", required_argument, 0, 'm' }, { "drop-rank-bound", no_argument, 0, 'd' },
		{ "port", required_argument, 0, 'p' },
		{ "export-safetensors", required_argument, 0, 'e' }, { "kind", required_argument, 0, 'k' },
		{ "buffer", required_argument, 0, 'b' }, { "quiet", no_argument, 0, 'q' },
		{ "import-safetensors", required_argument, 0, 'I' },
		{ "max-shard-size", required_argument, 0, 'M' },
		{ "name-map", required_argument, 0, 'n' }, { "dtype", required_argument, 0, 't' },
		{ "json", no_argument, 0, 'j' }, { "help", no_argument, 0, 'h' },
		{ "manifest-dir", required_argument, 0, 'D' },
		{ "out-manifest-dir", required_argument, 0, 'O' }, { 0, 0, 0, 0 },
	};
	/* --json anywhere: every error, usage errors included, is then a JSON object, whose
	 * op says which job was asked for. */
	a.json = tool_scan_has(argc, argv, 1, opts, 'j');
	tool_set_json(a.json);
	tool_set_op(tool_scan_has(argc, argv, 1, opts, 'e') ? "export" :
	            tool_scan_has(argc, argv, 1, opts, 'I') ? "import" : "reshard");
	const char *pos[2];
	int npos = 0, ch;
	bool have_world = false, have_pool = false, compress = false;
	const char *map = NULL;
	uint64_t v;
	optind = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (ch) {
		case 'w':
			if (tool_parse_u64_range(optarg, 1, 65536, &v))
				return tool_usage("--world '%s': a number of ranks from 1 to 65536", optarg);
			a.world = (unsigned)v;
			have_world = true;
			break;
		case 'o': a.out = optarg; break;
		case 's':
			if (tool_parse_u64_range(optarg, 0, CKPT_LATEST - 1, &a.out_step))
				return tool_usage("--step '%s': a step number from 0 to %" PRIu64, optarg,
				                  (uint64_t)CKPT_LATEST - 1);
			a.have_out_step = true;
			break;
		case 'C':
			if (tool_parse_size_opt("--chunk", optarg, TOOL_CHUNK_UNIT, TOOL_MAX_CHUNK,
			                   TOOL_CHUNK_UNIT, &a.chunk))
				return RX_USAGE;
			break;
		case 'P':
			/* At least two chunks of the smallest size: the library's own floor. */
			if (tool_parse_size_opt("--pool", optarg, 2 * TOOL_CHUNK_UNIT, SIZE_MAX, 0, &a.pool))
				return RX_USAGE;
			have_pool = true;
			break;
		case 'b':
			if (tool_parse_size_opt("--buffer", optarg, 1, SIZE_MAX, 0, &a.buffer))
				return RX_USAGE;
			break;
		case 'c':
			if (tool_parse_compress(optarg, &a.zstd_level, &a.compress_codec))
				return tool_usage("--compress '%s': none, zstd[:LEVEL] or bytegroup[:LEVEL] "
				                  "with LEVEL 1 to 22",
				                  optarg);
			compress = true;
			break;
		case 'm': map = optarg; break;
		case 'd': a.drop_rank_bound = true; break;
		case 'p':
			if (tool_parse_u64_range(optarg, 1, 65535, &v))
				return tool_usage("--port '%s': a port from 1 to 65535", optarg);
			a.port = (unsigned)v;
			break;
		case 'e': a.export_dir = optarg; break;
		case 'I': a.import_path = optarg; break;
		case 'n': a.name_map = optarg; break;
		case 'M':
			if (st_parse_shard_size(optarg, &a.max_shard))
				return tool_usage("--max-shard-size '%s': bytes, or a number with KB, MB, GB, "
				                  "TB (powers of 1000) or KiB, MiB, GiB, TiB", optarg);
			break;
		case 't':
			a.cast = !strcmp(optarg, "bf16") ? CKPT_BF16 : !strcmp(optarg, "fp16") ? CKPT_F16 :
			         !strcmp(optarg, "fp32") ? CKPT_F32 : 0;
			if (!a.cast)
				return tool_usage("--dtype '%s': bf16, fp16 or fp32", optarg);
			break;
		case 'k':
			if (parse_kinds(&a, optarg))
				return tool_usage("--kind '%s': comma-separated model, optimizer, rng, "
				                  "scheduler, extra, or all", optarg);
			break;
		case 'D':
		case 'O':
			/* The library refuses it too; said here as the usage error it is. */
			if (optarg[0] != '/') {
				char q[256];
				return tool_usage("--%s '%s': an absolute path", ch == 'D' ? "manifest-dir" :
				                  "out-manifest-dir", tool_quote(optarg, q, sizeof q));
			}
			*(ch == 'D' ? &a.manifest_dir : &a.out_manifest_dir) = optarg;
			break;
		case 'q': a.quiet = true; break;
		case 'j': a.json = true; break;
		case '?':
		case ':':
			return tool_getopt_error(ch, argv, opts);
		default: usage(stderr); return tool_usage("unexpected option");
		}
	}
	for (; optind < argc; optind++) {
		if (npos == 2) {
			char q[256];
			return tool_usage("too many arguments ('%s')", tool_quote(argv[optind], q, sizeof q));
		}
		pos[npos++] = argv[optind];
	}
	if (a.import_path) {
		if (a.export_dir || have_world || a.out || map || a.drop_rank_bound || a.port ||
		    a.kinds || a.buffer || a.max_shard || a.cast || a.out_manifest_dir)
			return tool_usage("--import-safetensors does not combine with --export-safetensors, "
			                  "--world, --out, --out-manifest-dir, --rank-map, "
			                  "--drop-rank-bound, --port, --kind, --buffer, --max-shard-size "
			                  "or --dtype");
		if (npos != 1)
			return tool_usage("--import-safetensors takes ROOT only (the step is --step S)");
		if (!a.have_out_step)
			return tool_usage("--import-safetensors needs --step S, the step to create");
		if (a.chunk && have_pool && a.pool < 2 * a.chunk)
			return tool_usage("--pool %" PRIu64 " is smaller than two chunks of --chunk %" PRIu64,
			                  a.pool, a.chunk);
		a.root = pos[0];
		return reshard_import_safetensors(&a);
	}
	if (npos != 2) {
		usage(stderr);
		return tool_usage("ROOT and STEP are required");
	}
	a.root = pos[0];
	if (!strcmp(pos[1], "latest"))
		a.latest = true;
	else if (tool_parse_u64_range(pos[1], 0, CKPT_LATEST - 1, &a.step)) {
		char q[256];
		return tool_usage("'%s' is not a step (a number from 0 to %" PRIu64 ", or latest)",
		                  tool_quote(pos[1], q, sizeof q), (uint64_t)CKPT_LATEST - 1);
	}
	if (a.export_dir) {
		/* Options of the reshard job would be ignored here: refused instead. */
		if (have_world || a.out || map || a.drop_rank_bound || a.have_out_step || a.chunk ||
		    a.port || compress || a.out_manifest_dir)
			return tool_usage("--export-safetensors does not combine with --world, --out, "
			                  "--out-manifest-dir, --step, --chunk, --compress, --port, "
			                  "--rank-map or --drop-rank-bound");
		return reshard_export_safetensors(&a);
	}
	if (!have_world || !a.out)
		return tool_usage("--world N and --out ROOT2 are required (or --export-safetensors "
		                  "FILE)");
	if (a.kinds)
		return tool_usage("--kind applies to --export-safetensors only");
	if (a.buffer)
		return tool_usage("--buffer applies to --export-safetensors only");
	if (a.max_shard || a.cast || a.name_map)
		return tool_usage("--max-shard-size, --dtype and --name-map apply to "
		                  "--export-safetensors and --import-safetensors only");
	if (map && a.drop_rank_bound)
		return tool_usage("--rank-map and --drop-rank-bound exclude each other");
	if (a.chunk && have_pool && a.pool < 2 * a.chunk)
		return tool_usage("--pool %" PRIu64 " is smaller than two chunks of --chunk %" PRIu64,
		                  a.pool, a.chunk);
	if (map && parse_rank_map(&a, map) != (int)a.world) {
		free(a.rank_map);
		return tool_usage("--rank-map '%s': %u comma-separated saved ranks (numbers, or '-')",
		                  map, a.world);
	}
	int x = reshard_run(&a);
	free(a.rank_map);
	return x;
}

