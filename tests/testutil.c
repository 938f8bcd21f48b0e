/*
 * testutil.c — helpers shared by the test programs (see testutil.h).
 */
#include "testutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

char *tu_tmpdir(const char *tag)
{
	const char *base = getenv("TMPDIR");
	char path[4096];
	if (!base || !*base)
		base = "/var/tmp";
	snprintf(path, sizeof path, "%s/ckpt-test-%s-XXXXXX", base, tag);
	if (!mkdtemp(path)) {
		fprintf(stderr, "mkdtemp %s: %s\n", path, strerror(errno));
		abort();
	}
	return strdup(path);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb; (void)flag; (void)ftw;
	return remove(p);
}

void tu_rmtree(const char *path)
{
	if (path)
		nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

unsigned tu_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	unsigned p = 0;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		p = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	if (!p) {
		fprintf(stderr, "tu_free_port: no TCP port on 127.0.0.1: %s\n", strerror(errno));
		abort();
	}
	return p;
}

uint64_t tu_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

uint64_t tu_seed(void)
{
	static uint64_t seed;
	static int done;
	if (!done) {
		const char *e = getenv("CKPT_TEST_SEED");
		seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
		fprintf(stderr, "test seed: CKPT_TEST_SEED=%llu\n", (unsigned long long)seed);
		done = 1;
	}
	return seed;
}

void tu_fill(void *p, size_t n, uint64_t seed, uint64_t stream)
{
	uint64_t s = seed ^ (stream * 0xD1B54A32D192ED03ull);
	unsigned char *b = p;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v = tu_rand(&s);
		memcpy(b + i, &v, 8);
	}
	if (i < n) {
		uint64_t v = tu_rand(&s);
		memcpy(b + i, &v, n - i);
	}
}

int tu_read_file(const char *path, void **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -errno;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	void *p = malloc(n > 0 ? (size_t)n : 1);
	if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
		free(p);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	*out = p;
	*len = (size_t)n;
	return 0;
}

int tu_write_file(const char *path, const void *p, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -errno;
	size_t w = fwrite(p, 1, len, f);
	int rc = fclose(f);
	return (w == len && rc == 0) ? 0 : -EIO;
}

int tu_flip_bit(const char *path, uint64_t off, int bit)
{
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return -errno;
	unsigned char c;
	if (pread(fd, &c, 1, (off_t)off) != 1) {
		close(fd);
		return -EIO;
	}
	c ^= (unsigned char)(1u << bit);
	int rc = pwrite(fd, &c, 1, (off_t)off) == 1 ? 0 : -EIO;
	close(fd);
	return rc;
}

static int count_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	static int *counter;
	(void)p; (void)ftw;
	if (!sb) { counter = (int *)(void *)p; return 0; }
	if (flag == FTW_F)
		(*counter)++;
	return 0;
}

int tu_count_files(const char *path)
{
	int n = 0;
	count_cb((const char *)(void *)&n, NULL, 0, NULL);
	nftw(path, count_cb, 16, FTW_PHYS);
	return n;
}

int tu_shard_path(const char *root, uint64_t step, uint32_t rank, char *out, size_t cap)
{
	char dir[4096], prefix[32];
	snprintf(dir, sizeof dir, "%s/step-%020llu", root, (unsigned long long)step);
	snprintf(prefix, sizeof prefix, "rank-%06u", rank);
	size_t pl = strlen(prefix);
	DIR *d = opendir(dir);
	if (!d)
		return -ENOENT;
	int found = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		if (strncmp(n, prefix, pl) || (n[pl] != '-' && n[pl] != '.'))
			continue;
		size_t len = strlen(n);
		if (len < 6 || strcmp(n + len - 6, ".shard"))
			continue;
		if (found++ == 0)
			snprintf(out, cap, "%s/%s", dir, n);
	}
	closedir(d);
	return found == 1 ? 0 : found ? -EEXIST : -ENOENT;
}

unsigned tu_count_lines(const char *s, const char *needle)
{
	unsigned n = 0;
	for (const char *l = s; *l;) {
		const char *e = strchr(l, '\n');
		size_t len = e ? (size_t)(e - l) : strlen(l);
		const char *hit = strstr(l, needle);
		if (hit && hit + strlen(needle) <= l + len)
			n++;
		l += len + (e ? 1 : 0);
	}
	return n;
}

unsigned long long tu_sum_suppressed(const char *s, const char *what)
{
	char pat[256];
	snprintf(pat, sizeof pat, "%s: ", what);
	size_t pl = strlen(pat);
	unsigned long long sum = 0;
	for (const char *p = s; (p = strstr(p, pat)); p += pl) {
		char *end;
		unsigned long long n = strtoull(p + pl, &end, 10);
		if (end != p + pl && !strncmp(end, " similar message", 16))
			sum += n;
	}
	return sum;
}

bool tu_utf8_ok(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned b = p[i], len = b < 0x80 ? 1 : b >> 5 == 6 ? 2 : b >> 4 == 14 ? 3 :
		                        b >> 3 == 30 ? 4 : 0;
		if (!len || i + len > n)
			return false;
		unsigned long cp = len == 1 ? b : b & (0x7fu >> len);
		for (unsigned k = 1; k < len; k++) {
			if (p[i + k] >> 6 != 2)
				return false;
			cp = cp << 6 | (p[i + k] & 0x3fu);
		}
		static const unsigned long min[] = { 0, 0, 0x80, 0x800, 0x10000 };
		if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return false;
		i += len;
	}
	return true;
}

void tu_gate_init(struct tu_gate *g)
{
	if (pipe(g->go) || pipe(g->entered)) {
		perror("tu_gate_init: pipe");
		abort();
	}
}

int tu_gate_source(void *arg, uint64_t off, void *dst, size_t len)
{
	struct tu_gate *g = arg;
	if (off == 0) {
		char b = 'x';
		if (write(g->entered[1], &b, 1) != 1 || read(g->go[0], &b, 1) != 1)
			return -EIO;
	}
	memset(dst, 0x5a, len);
	return 0;
}

void tu_gate_wait_entered(struct tu_gate *g)
{
	char b;
	if (read(g->entered[0], &b, 1) != 1) {
		perror("tu_gate_wait_entered");
		abort();
	}
}

void tu_gate_release(struct tu_gate *g)
{
	if (write(g->go[1], "g", 1) != 1) {
		perror("tu_gate_release");
		abort();
	}
}

void tu_gate_close(struct tu_gate *g)
{
	for (int i = 0; i < 2; i++) {
		close(g->go[i]);
		close(g->entered[i]);
	}
}
