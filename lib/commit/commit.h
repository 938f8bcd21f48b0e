/*
 * commit.h — lib/commit's interface: the coordinator's decision for a step.
 *
 * A vote is one rank's PREPARE: its encoded shard index and shard file facts, sent
 * only after that rank's data and directory entry are durable. commit_decide() is
 * the whole decision on an attempt, for every caller: once every vote is in,
 * validate the gathered index, then ONE durable manifest transaction
 * (docs/protocol.md §2); or record that the attempt ends without committing. The distributed state
 * machines (gathering votes over lib/net, timeouts, broadcasting the decision) are
 * built on it.
 *
 * Depends on: manifest (the commit txn), io (the shard index codec only), net.
 * Wire messages: docs/protocol.md.
 */
#ifndef CKPT_COMMIT_H
#define CKPT_COMMIT_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt_internal.h"
#include "io/io.h"
#include "manifest/manifest.h"

struct net_rdma_opts;   /* net/net.h */

struct commit_vote {
	uint32_t    rank;
	uint64_t    step;
	uint64_t    save_id;        /* the attempt the shard was written for (its file's name) */
	const void *index;          /* encoded shard index (the footer bytes) */
	size_t      index_len;
	uint64_t    file_size;
	uint8_t     footer_hash[CKPT_HASH_BYTES];
	/* The user's metadata of the step (a JSON object's text, at most
	 * MANIFEST_MAX_META bytes); only rank 0's is kept, so other ranks send none. */
	const void *meta;
	size_t      meta_len;
};

/*
 * Validate a gathered set of decoded indices (one per rank, ix[r] for rank r):
 * every rank exactly once, same step and world; every name with the same kind,
 * dtype, policy, flags and global shape on every rank; sharded tensors tile the
 * global shape exactly (no gap, no overlap); replicated items whole (box =
 * global shape) and identical by hash wherever present; rank-bound items at most
 * once per rank.
 * 0, or CKPT_EINVALID with the first problem in the error message.
 */
int commit_validate(const struct io_shard_index *const *ix, uint32_t world, uint64_t step);

/* ------------------------------------------------------------------ incremental validation
 * The same checks as commit_validate, one vote at a time as votes arrive, so that
 * little is left to do after the last one (gather.c). */
struct commit_gather;
struct commit_summary {
	uint32_t ntensors;          /* distinct names */
	uint64_t logical_bytes, stored_bytes;   /* stored: written by this step (references
	                                           to other steps' files not counted) */
	const struct manifest_ref *refs;        /* the other steps' files the shards
	                                           reference; owned by the gather */
	uint32_t nrefs;
};
/* owns: the gather frees the indexes it is given. */
int  commit_gather_create(uint32_t world, uint64_t step, bool owns, struct commit_gather **out);
/* Add rank ix->rank's index. CKPT_EINVALID (message names tensor and ranks) on the
 * first inconsistency; the gather then refuses everything. With owns, ix belongs to
 * the gather from this call on, whatever it returns. */
int  commit_gather_add(struct commit_gather *g, struct io_shard_index *ix);
/* Every rank in and nothing missing (no gap)? Fills sum. CKPT_EINVALID. */
int  commit_gather_finish(struct commit_gather *g, struct commit_summary *sum);
const struct io_shard_index *commit_gather_index(const struct commit_gather *g, uint32_t rank);
void commit_gather_free(struct commit_gather *g);

/*
 * The decision on one attempt at a step, for whoever coordinates it: the
 * coordinator thread (votes gathered as they arrived), a rank of a world of one and
 * a rebuild (the votes at once), and anyone who ends an attempt without committing
 * (the coordinator on a failed or timed-out step, a rank alone before its vote, GC
 * presuming an abort). What a caller has, and asks, is in struct commit_decision.
 */
struct commit_decision {
	/* The votes, in one of two forms. votes: id->world of them, votes[r] rank r's,
	 * decoded and validated here; with a save id every vote's index must carry it. */
	const struct commit_vote    *votes;
	/* Or shard records prepared as the votes arrived (commit_shard_record), shards[r]
	 * rank r's, and the gather that validated their indexes (not freed here). */
	const struct manifest_shard *shards;
	struct commit_gather        *gather;
	/* The manifest decides: a failure after the commit transaction (an injected
	 * fault, a lost disk) that left the step committed is logged and returns 0, so
	 * that no rank is told to delete the files of a committed step. */
	bool                         trust_manifest;
	/* No votes: the attempt ends without committing, for why (the abort record's
	 * reason). A step that committed after all, or whose record names another
	 * attempt by now, is left as it is; another failure is logged, and the files
	 * stay until the next open's GC presumes the attempt aborted. */
	bool                         abort;
	const char                  *why;
};
/*
 * Decide attempt id (step, world, save_id, incarnation, job_id, and the user's
 * metadata meta/meta_len: they go into the step record) as d says. A commit validates the votes, then commits them in one
 * durable manifest transaction (fault points coord_before_commit_txn and
 * coord_after_commit_txn around it): 0 (committed), -EEXIST (already committed),
 * -ESTALE (the manifest names another attempt), CKPT_EINVALID, CKPT_EFORMAT (a
 * vote's index does not decode), -EINVAL (neither form of votes), or the manifest's
 * error; on any failure other than -EEXIST the attempt is recorded as aborted, with
 * the reason, which stays this thread's message. An abort returns CKPT_EABORTED
 * and keeps this thread's message.
 */
int commit_decide(struct manifest *m, const struct manifest_step *id,
                  const struct commit_decision *d);

/* Rank v->rank's shard record for the commit transaction: its file (path, a
 * buffer of the caller's that must live as long as *out: the name carries the
 * vote's save id), size, and where its footer (the index ix decoded from v) lies,
 * with its hash. */
/* holder: the ckptd instance ("HOST:PORT") that holds the file when it is not under
 * the root (the path is then "@HOST:PORT/<step dir>/<file>"), or NULL. */
#define COMMIT_SHARD_PATH_MAX 352
void commit_shard_record(uint64_t step, const struct commit_vote *v,
                         const struct io_shard_index *ix, const char *holder,
                         char path[COMMIT_SHARD_PATH_MAX], struct manifest_shard *out);

/*
 * Begin a new attempt at a step, as its coordinator (the coordinator thread, or a
 * rank of a world of one): the files of the attempt the manifest names as dead
 * (ABORTED, or INFLIGHT under a coordinator that is gone) are removed from the step
 * directory first (root NULL: not), then an INFLIGHT record of id (step, world,
 * save_id, incarnation, job_id) is made durable — before any rank may write a file.
 * So a step directory only ever holds files that a record names. -EEXIST (the step
 * is committed), CKPT_ECORRUPT (its record is damaged: it may be a committed step's,
 * and nothing is touched), or the manifest's or the file system's error.
 */
int commit_attempt_begin(struct manifest *m, const char *root, const struct manifest_step *id);

/* ------------------------------------------------------------------ retention
 * The job's rules for keeping committed steps (ckpt_opts.keep_*; 0: no such rule).
 * Does a committed step survive them? latest: the latest committed step (always
 * kept); newer: how many committed steps are newer than it; commit_ns: its record's
 * commit time, now_ns the wall clock (a commit time in the future keeps it). Without
 * any rule every step is kept. For the embedded default's retention (lib/retention.c)
 * and ckptd's, which must agree. */
struct commit_keep { uint64_t last, every, seconds; };
bool commit_keep_step(const struct commit_keep *k, uint64_t step, uint64_t latest,
                      uint64_t newer, uint64_t commit_ns, uint64_t now_ns);

/* ------------------------------------------------------------------ coordinator
 * Listens for the W participants of a job, gathers BEGIN and PREPARE per step,
 * decides with commit_decide() in step order, and broadcasts the decision. Runs
 * its own thread; a handshake runs in a short-lived thread of its own, so a slow or
 * hostile peer never stalls the job. Presumed abort: any step whose votes are not
 * all in timeout_ms after its first vote, or whose non-voted rank disconnects,
 * aborts. Only BEGIN starts a step.
 */
struct commit_coord_opts {
	struct manifest *manifest;   /* borrowed; must outlive the coordinator */
	const char *root;            /* the checkpoint root: each vote is held to the shard
	                                file it names (io_shard_trailer_check), and a new
	                                attempt removes the files of the dead one before it;
	                                NULL: neither (tests of the protocol alone) */
	uint64_t    incarnation;     /* recorded in the steps this coordinator begins */
	const char *job_id;
	uint32_t    world;
	const void *secret;
	size_t      secret_len;
	int         transport;       /* enum net_transport */
	const struct net_rdma_opts *rdma;   /* NULL: defaults (net.h) */
	const char *addr;
	unsigned    port;            /* 0: ephemeral (tests) */
	unsigned    timeout_ms;
	/* Shards held by other processes (ckptd spreads a job's ranks over several
	 * instances): shard_holder(holder_arg, rank) names the instance that holds the
	 * rank's shard ("HOST:PORT"), or NULL for a shard under root. The shard's record
	 * then names it (commit_shard_record), and its vote is held to the file by
	 * remote_check(holder_arg, holder, rel, file_size, footer_off, footer_len,
	 * footer_hash), which asks the holder, instead of a local check. NULL: every
	 * shard is under root. */
	const char *(*shard_holder)(void *arg, uint32_t rank);
	int         (*remote_check)(void *arg, const char *holder, const char *rel,
	                            uint64_t file_size, uint64_t footer_off, uint64_t footer_len,
	                            const uint8_t footer_hash[CKPT_HASH_BYTES]);
	void        *holder_arg;     /* also on_decision's */
	/* Told each decision, before the ranks: code 0 (committed), or why not. */
	void        (*on_decision)(void *arg, uint64_t step, int code);
};
struct commit_coord;
/* Errors: -EINVAL (no manifest, job id or address; world 0), from net_listen
 * (-EADDRINUSE, ...), -ENOMEM. */
int  commit_coord_start(const struct commit_coord_opts *o, struct commit_coord **out);
unsigned commit_coord_port(const struct commit_coord *c);
/* Timing of the last step decided (benchmarks, logs): from the moment the last vote
 * was read off its connection to the moment the decision was sent on every link
 * (to every rank, or to every node leader in the hierarchical commit). */
struct commit_coord_stats {
	uint64_t step;
	uint64_t last_vote_ns;      /* decoding and checking the last vote */
	uint64_t commit_ns;         /* final checks and the durable commit transaction */
	uint64_t broadcast_ns;      /* sending the decision on every link */
	uint64_t total_ns;          /* last vote received -> decision sent */
	uint32_t sends;             /* links the decision went to: ranks, or node leaders */
};
int  commit_coord_last_stats(struct commit_coord *c, struct commit_coord_stats *out);
/* How many rank departures the coordinator's loop has processed so far: a rank's
 * connection closed, its node leader reported it gone, or a leader's link closed
 * (one for each of its ranks). Lets a caller that closes ranks know when
 * the coordinator has seen them go before it starts the next step with new ones:
 * a rank that leaves while a step it has not voted for is in flight aborts it. */
uint64_t commit_coord_ranks_left(struct commit_coord *c);
void commit_coord_stop(struct commit_coord *c);      /* NULL: no-op */

/* ------------------------------------------------------------------ node leader
 * The hierarchical commit (docs/protocol.md §2.8): the process of a
 * node's local rank 0 relays between the node's ranks and the coordinator, which
 * then exchanges messages with one connection per node. Votes are forwarded as
 * they arrive (the coordinator checks each), decisions come once per node and go
 * to each of its ranks. The node's ranks are first .. first+nranks-1 and connect
 * with commit_part_connect to local_addr over NET_UNIX. Runs its own thread.
 */
struct commit_leader_opts {
	int         transport;       /* to the coordinator (enum net_transport) */
	const struct net_rdma_opts *rdma;   /* NULL: defaults (net.h) */
	const char *addr;            /* the coordinator's */
	unsigned    port;
	const char *local_addr;      /* where the node's ranks connect (commit_leader_addr) */
	const char *job_id;
	uint32_t    rank, world;     /* the leader's own rank: it joins the coordinator as it */
	uint32_t    node;            /* the node's number, for messages */
	uint32_t    first, nranks;   /* the node's ranks; rank is one of them */
	const void *secret;
	size_t      secret_len;
	unsigned    timeout_ms;      /* connecting and joining */
};
struct commit_leader;
/* Listen on local_addr, join the coordinator and announce the node's ranks.
 * Errors: -EINVAL, -EADDRINUSE (another leader of this node runs here), the
 * coordinator's refusal (CKPT_EPEER: a rank already served), connect and handshake
 * errors (-ETIMEDOUT, CKPT_EAUTH, ...). */
int  commit_leader_start(const struct commit_leader_opts *o, struct commit_leader **out);
void commit_leader_stop(struct commit_leader *l);     /* NULL: no-op */
/* The local address of the leader of the node whose first rank is first, in job
 * job_id whose coordinator listens on port: "@libckpt-<hash of the job id>-<port>-
 * <first>", a Linux abstract unix socket that every rank of the node can derive. */
void commit_leader_addr(char *out, size_t cap, const char *job_id, unsigned port,
                        uint32_t first);

/* ------------------------------------------------------------------ refusal
 * When rank 0 cannot start the coordinator (or a node leader cannot join it), the
 * other ranks would otherwise retry their connection until the timeout: listen on
 * the address they connect to and answer each one's handshake, once it proved the
 * secret, with a REJECT carrying code and why (refuse.c). Returns when expect ranks
 * were told, when none came for a moment after the last one, or after grace_ms.
 * Best effort: an address another process holds is logged and skipped. */
struct commit_refuse_opts {
	int         transport;       /* enum net_transport */
	const struct net_rdma_opts *rdma;   /* NULL: defaults (net.h) */
	const char *addr;
	unsigned    port;
	const char *job_id;
	uint32_t    world;
	const void *secret;
	size_t      secret_len;
	uint32_t    expect;          /* ranks (or leaders) that will connect here */
	unsigned    grace_ms;
	int         code;            /* the cause: a negative code of ours or a -errno */
	const char *why;             /* its text, as the ranks will read it */
	const char *who;             /* "coordinator", "node leader": for log lines */
};
void commit_refuse(const struct commit_refuse_opts *o);

/* ------------------------------------------------------------------ participant
 * How a rank takes part in the commit of each save: begin, then prepare (the vote)
 * and wait for the decision, or abort. One road for every world size: in a world
 * of several ranks a connection to the coordinator, with a receiver thread that
 * files replies and decisions by step (commit_part_connect); a rank alone is its
 * own coordinator and decides against the manifest in its own thread
 * (commit_part_open_local). Any thread may call these. */
struct commit_part_opts {
	int         transport;
	const struct net_rdma_opts *rdma;   /* NULL: defaults (net.h) */
	const char *addr;
	unsigned    port;
	const char *job_id;
	uint32_t    rank, world;
	const void *secret;
	size_t      secret_len;
	unsigned    timeout_ms;      /* connect, and default for waits */
	const char *peer_name;       /* optional: what messages call the peer (default
	                                "coordinator ADDR:PORT"), e.g. through a node leader */
};
struct commit_part;
/* Connect and authenticate. Errors: -ETIMEDOUT, CKPT_EAUTH, CKPT_EPEER, ... */
int  commit_part_connect(const struct commit_part_opts *o, struct commit_part **out);
/* A world of one: begin records the attempt (commit_attempt_begin), prepare
 * decides at once (commit_decide with the one vote; the manifest decides after its
 * transaction), abort before the vote records the attempt aborted, and wait returns
 * what prepare decided. Errors: -ENOMEM. */
struct commit_local_opts {
	struct manifest *manifest;   /* borrowed; must outlive the participant */
	const char *root;
	uint64_t    incarnation;     /* recorded in the steps it begins */
	const char *job_id;
};
int  commit_part_open_local(const struct commit_local_opts *o, struct commit_part **out);
void commit_part_close(struct commit_part *p);        /* NULL: no-op */
/* May this rank write step? 0 with *save_id the attempt's id (its files carry it),
 * -EEXIST (committed), or the coordinator's refusal. */
int  commit_part_begin(struct commit_part *p, uint64_t step, uint64_t *save_id);
/* The attempt (save id) this rank began for step, 0 if it began none. */
uint64_t commit_part_attempt(struct commit_part *p, uint64_t step);
/* Send this rank's vote (after its shard is durable). The coordinator counts it
 * only for a step this rank has begun (commit_part_begin) that is still in flight;
 * otherwise the wait for it reports CKPT_EABORTED. A second vote for the same
 * attempt is ignored: the first stands. */
int  commit_part_prepare(struct commit_part *p, const struct commit_vote *v);
/* Tell the coordinator this rank cannot vote for step (a local failure). */
int  commit_part_abort(struct commit_part *p, uint64_t step, int code, const char *why);
/* Wait for the decision on step: 0 committed; CKPT_EABORTED (message: the reason);
 * CKPT_EINDOUBT if the coordinator was lost or silent after this rank voted. */
int  commit_part_wait(struct commit_part *p, uint64_t step, int timeout_ms);
/* The coordinator's decision on step, if it comes within timeout_ms, this rank
 * giving nothing up: 0 committed, or CKPT_EABORTED (-EEXIST) with the coordinator's
 * reason, after which the step is over for this rank as after commit_part_wait;
 * -ETIMEDOUT where none came (nothing changes; a rank alone: at once). For a rank
 * whose data path heard, before its vote, that the attempt was given up. */
int  commit_part_decided(struct commit_part *p, uint64_t step, int timeout_ms);

#endif /* CKPT_COMMIT_H */
