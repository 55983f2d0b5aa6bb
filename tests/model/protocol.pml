/*
 * agentsafe's exactly-once protocol across replicas, as a Promela model (issue 29).
 *
 * claim -> journal -> dispatch -> lease -> takeover -> reconcile -> settle, with replicas that
 * pause, crash and lose the database, a provider that counts executions per idempotency key,
 * and clients that retry the same key. docs/protocol.md maps every step (the "STEP ..." lines
 * printed along a trail) to the code that implements it; `make model` checks this file with
 * spin (tests/model/run.sh).
 *
 * Build switches (spin -D..., passed on to cpp):
 *   NR, NK, MAXREQ     replicas, keys, requests per key (defaults 2, 2, 2)
 *   MAXPAUSE MAXCRASH MAXPART MAXFAIL   how many faults of each class (defaults 2, 1, 1, 1)
 *   ASYNC              asynchronous replication: a failover may lose acknowledged writes
 *   LEAN               no lost replies, and the local lease check fails only when the
 *                      database's lease did (the two-key configuration)
 *   NOEXPIRE           no grant expires within a run (the teeth test: only the double
 *                      execution can be found)
 *   NOFENCE            the code before the fence: no epoch, the claim not fenced by the
 *                      attempt's owner, no lease check before the send (spin must find the
 *                      double execution of issue 29)
 *   GAP_TAKEN_OVER_NOT_EXECUTED  a request whose key was taken over before its attempt opened
 *                      answers FAILED_BEFORE_DISPATCH / executed:false (the code up to issue 29)
 *                      instead of a refusal that asks the caller to retry
 *
 * Properties:
 *   - at most once: each key reaches the provider at most once (assert at each execution);
 *   - truthful answers: no answer (a request's, a replay's, a reconciliation's) says
 *     "not executed" for a key that executed, in either order (assert at both ends);
 *   - settles: in every state where nothing can move any more (faults are bounded, so every run
 *     ends), every key is settled: answered, free, or free to be taken over; nothing open is
 *     left owned by nobody who will resolve it; with ASYNC, every lost acknowledged claim was
 *     detected (its replica halted with STORE_LOST_WRITES and listed the key);
 *   - with ASYNC the first two are weakened to "... unless an acknowledged claim of that key
 *     was lost in the failover": synchronous replication is the requirement for more than one
 *     replica (docs/high-availability.md).
 *   A non-progress run (pan -l) shows that no run cycles, so the check at quiescence covers
 *   "every key eventually settles once the faults stop".
 */

#ifndef NR
#define NR 2
#endif
#ifndef NK
#define NK 2
#endif
#ifndef MAXREQ
#define MAXREQ 2
#endif
#ifndef MAXPAUSE
#define MAXPAUSE 2
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXPART
#define MAXPART 1
#endif
#ifndef MAXFAIL
#define MAXFAIL 1
#endif

#ifndef MAXREQ1
#define MAXREQ1 1
#endif
/* one attempt (and one grant) per request: key 0's are 0 .. MAXREQ-1, key 1's follow */
#if NK == 2
#define NA (MAXREQ + MAXREQ1)
#else
#define NA MAXREQ
#endif
#define NONE 255
#define KEY(a) ((a) >= MAXREQ)
#define FIRST(k) ((k) * MAXREQ)
#define REQS(k) ((k) == 0 -> MAXREQ : MAXREQ1)

/* idempotency key (table idempotency) */
#define K_ABSENT 0
#define K_INPROG 1
#define K_DONE   2
/* attempt row (table attempts) */
#define A_NONE   0
#define A_OPEN   1
#define A_CLOSED 2
/* last_status of an open attempt */
#define ST_NONE    0
#define ST_UNKNOWN 1
/* answers */
#define ANS_NONE      0
#define ANS_COMPLETED 1   /* executed: true */
#define ANS_NOT_EXEC  2   /* executed: false (FAILED_BEFORE_DISPATCH, RECONCILED_NOT_EXECUTED) */
#define ANS_UNKNOWN   3   /* UNKNOWN_AFTER_DISPATCH: not final */
#define ANS_RETRY     4   /* 409/503 refusal: not final, retry with the same key */
/* the dispatch window: from the claim until the grant's expiry plus the dispatch deadline */
#define W_NONE   0
#define W_OPEN   1
#define W_CLOSED 2
/* a send */
#define S_NONE     0
#define S_INFLIGHT 1
#define S_LANDED   2
#define S_LOST     3
/* resolutions (lifecycle/reconcile.py) */
#define R_UNCLAIMED 1
#define R_COMPLETED 2
#define R_NOT_EXEC  3
#define R_UNKNOWN   4

/* ---- the database (primary) ---- */
byte k_state[NK]; byte k_holder[NK]; bool k_lapsed[NK]; byte k_att[NK]; byte k_answer[NK];
byte a_state[NA]; byte a_owner[NA]; byte a_epoch[NA]; bool a_lapsed[NA]; bool a_claimed[NA];
byte a_status[NA];
bool g_claimed[NA];                 /* grant_claims */
bool dbdown;                        /* between a primary's loss and a standby's promotion */
#ifdef ASYNC
/* the asynchronous standby: what the primary had when it last caught up */
byte s_k_state[NK]; byte s_k_holder[NK]; bool s_k_lapsed[NK]; byte s_k_att[NK];
byte s_k_answer[NK];
byte s_a_state[NA]; byte s_a_owner[NA]; byte s_a_epoch[NA]; bool s_a_lapsed[NA];
bool s_a_claimed[NA]; byte s_a_status[NA];
bool s_g_claimed[NA];
bool dirty;                         /* the primary has writes the standby lacks */
#define DIRTY dirty = 1
#else
#define DIRTY skip
#endif

/* ---- each replica's own journal (a file on its own disk: survives its crash) ---- */
bool j_open[NA]; bool j_claimed[NA]; bool j_closed[NA];
/* ---- the provider ---- */
byte execs[NK]; byte win[NA]; byte send[NA];
/* ---- replicas ---- */
bool paused[NR]; bool down[NR]; bool parted[NR]; bool halted[NR]; bool starting[NR];
byte inc[NR];                       /* incarnation: a crash ends every task of the process */
bool unk[NA];                       /* the process's in-memory set of unknown attempts */
byte holds[NA];                     /* r+1: replica r's process holds the attempt's fence */
byte settling[NA];                  /* r+1: replica r's keeper resolved it, its key not settled yet */
/* ---- requests ---- */
byte req_rep[NA]; byte req_inc[NA]; bool req_live[NA]; byte ans[NA];
/* ---- ghosts for the properties ---- */
bool said_not_exec[NK]; bool lost[NK]; bool blocked[NK];
byte clients_done;
byte npause, ncrash, npart, nfail;

#define UP(r)      (!paused[r] && !down[r] && !halted[r])
#define DB(r)      (UP(r) && !parted[r] && !dbdown)
#define ALIVE(a)   (inc[req_rep[a]] == req_inc[a] && !halted[req_rep[a]])
#define STALLED(r) (paused[r] || down[r] || parted[r] || halted[r] || dbdown)

/* a key IN_PROGRESS that its holder may have left (state/pgstore.py, _stale_key) */
#define ABANDONED(k) ((k_att[k] == NONE && k_lapsed[k]) || \
                      (k_att[k] != NONE && a_state[k_att[k]] == A_CLOSED && !a_claimed[k_att[k]]))
#define UNANSWERED(k) (k_att[k] != NONE && a_state[k_att[k]] == A_CLOSED && a_claimed[k_att[k]])

/* "closed more than a lease ago": its request, which closes and then completes within
   milliseconds, has finished or is stopped, and so has the reconciler that closed it and is about
   to settle its key */
#define CLOSED_LONG_AGO(k) ((!req_live[k_att[k]] || STALLED(req_rep[k_att[k]])) && \
  (settling[k_att[k]] == 0 || STALLED(settling[k_att[k]] - 1)))

#ifdef NOFENCE
#define EPOCH_IS(x, e) true
#else
#define EPOCH_IS(x, e) (a_epoch[x] == (e))
#endif

#ifdef LEAN
#define MAY_WITHHOLD !(a_state[a] == A_OPEN && a_owner[a] == r && a_epoch[a] == ep && !a_lapsed[a])
#else
#define MAY_WITHHOLD true
#endif

/* the request leaves for the provider; after the grant's expiry plus the dispatch deadline it
   can no longer land (the provider refuses the expired grant, or the send's deadline passed) */
#define SEND(x) if :: win[x] == W_OPEN -> send[x] = S_INFLIGHT :: else -> send[x] = S_LOST fi

/* the mirror forgets an attempt's fence when it closes it (SharedAttemptMirror._write_settle) */
#define DROP_FENCE(x) if :: holds[x] == r + 1 -> holds[x] = 0 :: else -> skip fi

/* ATTEMPT_CLOSED with the answer the caller is given completes the request's key in the close's
   own statement (PostgresAttempts.close_answering): only a key IN_PROGRESS under this request's
   holder takes it; then the request's idempotency_complete sends nothing, and the caller is
   answered (answered:). Otherwise the request's own completion says why (complete:). */
#define KEY_TAKES_ANSWER \
  if \
  :: k_state[k] == K_INPROG && k_holder[k] == a -> \
       k_state[k] = K_DONE; k_answer[k] = out; DIRTY; \
       printf("STEP complete r=%d a=%d k=%d answer=%d WITH_CLOSE\n", r, a, k, out); \
       goto answered \
  :: else -> skip \
  fi

#ifdef ASYNC
#define EXCUSED(k) lost[k]
#else
#define EXCUSED(k) false
#endif

/* an answer that says "not executed" for key k */
#define SAY_NOT_EXEC(k) said_not_exec[k] = 1; assert(execs[k] == 0 || EXCUSED(k))
/* the request's answer to its caller, and its end */
#define ANSWER \
  ans[a] = out; req_live[a] = 0; \
  if :: out == ANS_NOT_EXEC -> SAY_NOT_EXEC(k) :: else -> skip fi; \
  printf("STEP answer r=%d a=%d k=%d answer=%d\n", r, a, k, out); \
  goto finish

#if NA == 2
#define FORA(M) M(0) M(1)
#elif NA == 3
#define FORA(M) M(0) M(1) M(2)
#elif NA == 4
#define FORA(M) M(0) M(1) M(2) M(3)
#elif NA == 5
#define FORA(M) M(0) M(1) M(2) M(3) M(4)
#else
#error "NA (the number of requests) must be 2 to 5"
#endif
#if NR == 2
#define FORR(M) M(0) M(1)
#elif NR == 3
#define FORR(M) M(0) M(1) M(2)
#else
#error "NR must be 2 or 3"
#endif
#if NK == 2
#define FORK(M) M(0) M(1)
#elif NK == 1
#define FORK(M) M(0)
#else
#error "NK must be 1 or 2"
#endif

/* ------------------------------------------------------------------------------------------
 * One request for key k on replica r: lifecycle/pipeline.py and lifecycle/attempt.py.
 * Each step is one atomic statement of the real system (one SQL statement or transaction,
 * one journal append); the process can stop between any two (pause, crash).
 * ------------------------------------------------------------------------------------------ */
proctype request(byte a; byte k; byte r)
{
  byte ep = 0;          /* the fencing token this request holds (AttemptFence.epoch) */
  byte out = ANS_NONE;

  /* idempotency_begin: INSERT ... ON CONFLICT DO NOTHING, or read / take over / reopen */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) && !starting[r] ->
       if
       :: k_state[k] == K_ABSENT ->
            k_state[k] = K_INPROG; k_holder[k] = a; k_lapsed[k] = 0; k_att[k] = NONE; DIRTY;
            printf("STEP begin r=%d a=%d k=%d NEW\n", r, a, k)
       :: k_state[k] == K_DONE ->
            out = k_answer[k];
            printf("STEP begin r=%d a=%d k=%d REPLAY answer=%d\n", r, a, k, out);
            ANSWER
       :: k_state[k] == K_INPROG && ABANDONED(k) ->
            k_holder[k] = a; k_lapsed[k] = 0; k_att[k] = NONE; DIRTY;
            printf("STEP begin r=%d a=%d k=%d TAKEOVER_KEY\n", r, a, k)
       :: k_state[k] == K_INPROG && UNANSWERED(k) && CLOSED_LONG_AGO(k) ->
            a_state[k_att[k]] = A_OPEN; a_lapsed[k_att[k]] = 1;
#ifndef NOFENCE
            a_epoch[k_att[k]]++;
#endif
            DIRTY; out = ANS_RETRY;
            printf("STEP begin r=%d a=%d k=%d REOPEN_UNANSWERED a=%d\n", r, a, k, k_att[k]);
            ANSWER
       :: else ->
            out = ANS_RETRY;
            printf("STEP begin r=%d a=%d k=%d IN_PROGRESS\n", r, a, k);
            ANSWER
       fi }
  fi;

  /* ATTEMPT_OPENED: the journal file, then the mirror's fenced INSERT (PostgresAttempts.opened:
     WITH fenced AS (UPDATE idempotency SET opened_attempt ... WHERE holder = ...) INSERT ...) */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) ->
       j_open[a] = 1;
       if
       :: k_state[k] == K_INPROG && k_holder[k] == a ->
            k_att[k] = a; a_state[a] = A_OPEN; a_owner[a] = r; a_epoch[a] = 1; a_lapsed[a] = 0;
            ep = 1; holds[a] = r + 1; DIRTY;
            printf("STEP open r=%d a=%d k=%d epoch=1\n", r, a, k)
       :: else ->
            printf("STEP open r=%d a=%d k=%d KEY_TAKEN_OVER\n", r, a, k);
#ifdef GAP_TAKEN_OVER_NOT_EXECUTED
            out = ANS_NOT_EXEC;       /* FAILED_BEFORE_DISPATCH, JOURNAL_UNAVAILABLE */
#else
            out = ANS_RETRY;          /* 409 IDEMPOTENCY_TAKEN_OVER */
#endif
            ANSWER
       fi }
  fi;

#ifdef NOFENCE
  /* the claim before issue 29: INSERT INTO grant_claims, whoever owns the attempt now */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) ->
       g_claimed[a] = 1; win[a] = W_OPEN; DIRTY;
       printf("STEP claim r=%d a=%d k=%d UNFENCED\n", r, a, k) }
  fi;
  /* GRANT_CLAIMED: the journal file, then UPDATE attempts ... WHERE attempt_id = ? */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) ->
       j_claimed[a] = 1; a_claimed[a] = 1; DIRTY;
       printf("STEP grant-claimed r=%d a=%d\n", r, a) }
  fi;
  /* the handler sends */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && UP(r) ->
       SEND(a);
       printf("STEP send r=%d a=%d k=%d\n", r, a, k) }
  fi;
#else
  /* the fenced claim: one statement (PostgresUseStore.claim_grant with a fence):
     WITH fenced AS (UPDATE attempts SET grant_claimed = true, ..., lease_until = now + lease
       WHERE attempt_id = ? AND owner = ? AND epoch = ? AND state <> 'CLOSED' AND NOT grant_claimed
       AND lease_until > now RETURNING ...)
     INSERT INTO grant_claims ... SELECT ... FROM fenced */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) ->
       if
       :: a_state[a] == A_OPEN && a_owner[a] == r && a_epoch[a] == ep && !a_claimed[a] &&
          !a_lapsed[a] ->
            g_claimed[a] = 1; a_claimed[a] = 1; win[a] = W_OPEN; DIRTY;
            printf("STEP claim r=%d a=%d k=%d epoch=%d FENCED_OK\n", r, a, k, ep)
       :: else ->
            /* ATTEMPT_FENCED: nothing claimed; the journal closes it FENCED, the mirror's close
               is fenced by owner and epoch too; the caller gets 409 ATTEMPT_FENCED */
            j_closed[a] = 1;
            if
            :: a_state[a] == A_OPEN && a_owner[a] == r && a_epoch[a] == ep ->
                 a_state[a] = A_CLOSED; DIRTY
            :: else -> skip
            fi;
            DROP_FENCE(a);
            out = ANS_RETRY;
            printf("STEP claim r=%d a=%d k=%d epoch=%d ATTEMPT_FENCED\n", r, a, k, ep);
            ANSWER
       fi }
  fi;
  /* GRANT_CLAIMED in the journal file (the row already says so), then the attempt, between the
     seam's prepare and run: send only if the lease (the local monotonic deadline,
     AttemptFence.can_dispatch) outlives the dispatch deadline. The local deadline is
     conservative: it has passed whenever the database's lease lapsed or the attempt was taken
     over; it may pass earlier. */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && UP(r) && a_state[a] == A_OPEN && a_owner[a] == r &&
              a_epoch[a] == ep && !a_lapsed[a] ->
       j_claimed[a] = 1; SEND(a);
       printf("STEP send r=%d a=%d k=%d epoch=%d\n", r, a, k, ep) }
  :: atomic { ALIVE(a) && UP(r) && MAY_WITHHOLD ->
       /* ATTEMPT_LEASE_LAPSED: nothing sent; the grant is claimed, so nobody else sends it */
       j_claimed[a] = 1; out = ANS_NOT_EXEC;
       printf("STEP withheld r=%d a=%d k=%d ATTEMPT_LEASE_LAPSED\n", r, a, k);
       goto close }
  fi;
#endif

  /* the provider's reply and ATTEMPT_CLOSED (the journal file, then the mirror's close, fenced
     by owner and epoch), or no reply: UNKNOWN_AFTER_DISPATCH, the attempt left open and in
     the process's unknown set (on_unknown) */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) && send[a] == S_LANDED ->
       out = ANS_COMPLETED; j_closed[a] = 1;
       if
       :: a_state[a] == A_OPEN && a_owner[a] == r && EPOCH_IS(a, ep) ->
            a_state[a] = A_CLOSED; DIRTY
       :: else -> skip
       fi;
       DROP_FENCE(a);
       printf("STEP close r=%d a=%d answer=%d\n", r, a, out) }
  :: atomic { ALIVE(a) && DB(r) && send[a] == S_LANDED ->
       out = ANS_COMPLETED; j_closed[a] = 1;
       if
       :: a_state[a] == A_OPEN && a_owner[a] == r && EPOCH_IS(a, ep) ->
            a_state[a] = A_CLOSED; DIRTY
       :: else -> skip
       fi;
       DROP_FENCE(a);
       printf("STEP close r=%d a=%d answer=%d WITH_ANSWER\n", r, a, out);
       KEY_TAKES_ANSWER }
#ifndef LEAN
  :: atomic { ALIVE(a) && UP(r) && send[a] == S_LANDED ->
       out = ANS_UNKNOWN; unk[a] = 1; printf("STEP reply r=%d a=%d LOST_REPLY\n", r, a);
       ANSWER }
#endif
  :: atomic { ALIVE(a) && UP(r) && send[a] == S_LOST ->
       out = ANS_UNKNOWN; unk[a] = 1; printf("STEP reply r=%d a=%d TIMEOUT\n", r, a);
       ANSWER }
  fi;
  goto complete;

close:
  /* ATTEMPT_CLOSED of an attempt that sent nothing */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) ->
       j_closed[a] = 1;
       if
       :: a_state[a] == A_OPEN && a_owner[a] == r && EPOCH_IS(a, ep) ->
            a_state[a] = A_CLOSED; DIRTY
       :: else -> skip
       fi;
       DROP_FENCE(a);
       printf("STEP close r=%d a=%d answer=%d\n", r, a, out) }
  :: atomic { ALIVE(a) && DB(r) ->
       j_closed[a] = 1;
       if
       :: a_state[a] == A_OPEN && a_owner[a] == r && EPOCH_IS(a, ep) ->
            a_state[a] = A_CLOSED; DIRTY
       :: else -> skip
       fi;
       DROP_FENCE(a);
       printf("STEP close r=%d a=%d answer=%d WITH_ANSWER\n", r, a, out);
       KEY_TAKES_ANSWER }
  fi;

complete:
  /* idempotency_complete: UPDATE idempotency SET state = 'DONE' ... WHERE holder = ours */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && DB(r) ->
       if
       :: k_state[k] == K_INPROG && k_holder[k] == a ->
            k_state[k] = K_DONE; k_answer[k] = out; DIRTY;
            printf("STEP complete r=%d a=%d k=%d answer=%d\n", r, a, k, out)
       :: else ->
            /* IDEMPOTENCY_TAKEN_OVER or ALREADY_COMPLETE: the answer is given, unrecorded */
            printf("STEP complete r=%d a=%d k=%d NOT_RECORDED\n", r, a, k)
       fi;
       ANSWER }
  fi;

answered:
  /* the key took the answer with the attempt's close: nothing more is sent, the caller is
     answered */
  if
  :: !ALIVE(a) -> goto dead
  :: atomic { ALIVE(a) && UP(r) -> ANSWER }
  fi;

dead:
  req_live[a] = 0;
finish:
  skip
}

/* ------------------------------------------------------------------------------------------
 * A replica's lease keeper and start-up reconciliation: lifecycle/leases.py, reconcile.py,
 * plane.py. t is the attempt in hand, lost with the process on a crash.
 * ------------------------------------------------------------------------------------------ */

#ifdef GAP_RENEW_ALL
/* as coded: every open row the replica's id owns, known to this process or not */
#define RENEWS(x) (a_state[x] == A_OPEN && a_owner[x] == r)
#else
#define RENEWS(x) (a_state[x] == A_OPEN && a_owner[x] == r && holds[x] == r + 1)
#endif

proctype keeper(byte r)
{
  byte t = NONE; bool tc; byte res; byte phase = 0; byte si = 0; byte myinc = 0; byte i;

end_keeper:
  do
  /* a crash lost the process's memory: start again */
  :: atomic { myinc != inc[r] && !down[r] ->
       if :: t != NONE && settling[t] == r + 1 -> settling[t] = 0 :: else -> skip fi;
       myinc = inc[r]; phase = 0; t = NONE; si = 0 }

  /* start-up reconciliation: each attempt this replica's journal still holds open is taken
     (LeaseKeeper.gate -> PostgresAttempts.take: SELECT ... FOR UPDATE, _move) and resolved */
  :: atomic { myinc == inc[r] && DB(r) && starting[r] && phase == 0 ->
       do
       :: si < NA && !(req_rep[si] == r && j_open[si] && !j_closed[si]) -> si++
       :: si < NA && req_rep[si] == r && j_open[si] && !j_closed[si] -> break
       :: si == NA -> break
       od;
       if
       :: si == NA ->
            starting[r] = 0; si = 0;
            printf("STEP started r=%d\n", r)
       :: else ->
            if
            :: a_state[si] == A_NONE ->            /* ABSENT: the journal alone decides */
                 t = si; tc = j_claimed[si] || g_claimed[si]; phase = 1;
                 printf("STEP startup-take r=%d a=%d ABSENT\n", r, si)
            :: a_state[si] == A_CLOSED ->
                 printf("STEP startup-take r=%d a=%d CLOSED\n", r, si)
            :: a_state[si] == A_OPEN && a_owner[si] != r && !a_lapsed[si] ->
                 printf("STEP startup-take r=%d a=%d HELD\n", r, si)
            :: else ->
                 a_owner[si] = r; a_lapsed[si] = 0;
#ifndef NOFENCE
                 a_epoch[si]++;
#endif
                 DIRTY;
                 t = si; tc = j_claimed[si] || g_claimed[si]; phase = 1; holds[si] = r + 1;
                 printf("STEP startup-take r=%d a=%d TAKEN epoch=%d\n", r, si, a_epoch[si])
            fi;
            si++
       fi }

  /* renew (SharedAttemptMirror.renew -> PostgresAttempts.renew): UPDATE attempts SET
     lease_until = now + lease WHERE owner = ? AND state <> 'CLOSED' [AND attempt_id = ANY(the
     attempts this process holds a fence for)]; only a renewal that changes something is a
     step (a lapsed lease no one took yet) */
  :: atomic { myinc == inc[r] && DB(r) && !starting[r] &&
              (false
#define RENEWABLE(x) || (RENEWS(x) && a_lapsed[x])
               FORA(RENEWABLE)) ->
       i = 0;
       do
       :: i < NA -> if :: RENEWS(i) -> a_lapsed[i] = 0
                       :: else -> skip fi; i++
       :: else -> break
       od;
       DIRTY;
       printf("STEP renew r=%d\n", r) }

  /* take_lapsed: the oldest open attempt whose lease lapsed, FOR UPDATE SKIP LOCKED, moved
     to this replica and its epoch incremented (_move) in one transaction */
  :: atomic { myinc == inc[r] && DB(r) && !starting[r] && phase == 0 &&
              (false
#define LAPSED(x) || (a_state[x] == A_OPEN && a_lapsed[x])
               FORA(LAPSED)) ->
       i = 0;
       do
       :: a_state[i] == A_OPEN && a_lapsed[i] -> break
       :: else -> i++
       od;
       t = i; a_owner[t] = r; a_lapsed[t] = 0;
#ifndef NOFENCE
       a_epoch[t]++;
#endif
       DIRTY;
       tc = a_claimed[t]; phase = 1; holds[t] = r + 1;
       printf("STEP takeover r=%d a=%d k=%d epoch=%d claimed=%d\n", r, t, KEY(t), a_epoch[t], tc) }

  /* ask again about an attempt this replica owns whose last resolution was STILL_UNKNOWN
     (owned_unknown), or one its own request left unknown (plane.py: gate, then reconcile);
     only when the answer can have changed (a lookup that still finds nothing is a no-op) */
  :: atomic { myinc == inc[r] && DB(r) && !starting[r] && phase == 0 &&
              (false
#define ASKABLE(x) || (a_state[x] == A_OPEN && a_owner[x] == r && (a_status[x] == ST_UNKNOWN || unk[x]) \
                       && (execs[KEY(x)] > 0 || win[x] != W_OPEN))
               FORA(ASKABLE)) ->
       i = 0;
       do
       :: a_state[i] == A_OPEN && a_owner[i] == r && (a_status[i] == ST_UNKNOWN || unk[i]) &&
          (execs[KEY(i)] > 0 || win[i] != W_OPEN) -> break
       :: else -> i++
       od;
       t = i; tc = a_claimed[t] || g_claimed[t];
       if
       :: unk[t] ->   /* plane.py's re-ask goes through the gate: a take */
            unk[t] = 0; holds[t] = r + 1;
#ifndef NOFENCE
            a_epoch[t]++; DIRTY;
#endif
            skip
       :: else -> skip
       fi;
       phase = 1;
       printf("STEP reask r=%d a=%d k=%d\n", r, t, KEY(t)) }

  /* lost writes: a grant claim this replica's journal acknowledged that the database lacks
     (a database that went back in time): halt, STORE_LOST_WRITES, the key listed */
  :: atomic { myinc == inc[r] && DB(r) &&
              (false
#define LOSTCLAIM(x) || (req_rep[x] == r && j_claimed[x] && !g_claimed[x])
               FORA(LOSTCLAIM)) ->
       i = 0;
       do
       :: i < NA -> if :: req_rep[i] == r && j_claimed[i] && !g_claimed[i] -> blocked[KEY(i)] = 1
                       :: else -> skip fi; i++
       :: else -> break
       od;
       halted[r] = 1;
       printf("STEP halt r=%d STORE_LOST_WRITES\n", r) }

  /* resolve read-only (reconcile.py, _resolve): RECONCILED in the journal, the mirror's close
     or STILL_UNKNOWN, fenced by the taker's owner and epoch */
  :: atomic { myinc == inc[r] && DB(r) && phase == 1 ->
       if
       :: !tc -> res = R_UNCLAIMED
       :: tc && execs[KEY(t)] > 0 -> res = R_COMPLETED
       :: tc && execs[KEY(t)] == 0 && win[t] != W_OPEN -> res = R_NOT_EXEC
       :: tc && execs[KEY(t)] == 0 && win[t] == W_OPEN -> res = R_UNKNOWN   /* too early */
       fi;
       if
       :: a_state[t] == A_OPEN && a_owner[t] == r ->
            if
            :: res == R_UNKNOWN -> a_status[t] = ST_UNKNOWN
            :: else -> a_state[t] = A_CLOSED; DROP_FENCE(t)
            fi;
            DIRTY
       :: else -> skip
       fi;
       printf("STEP resolve r=%d a=%d k=%d resolution=%d\n", r, t, KEY(t), res);
       if
       :: res == R_UNKNOWN -> phase = 0; t = NONE
       :: else -> phase = 2; settling[t] = r + 1
       fi }

  /* settle_idempotency (lifecycle/recovery.py): UNCLAIMED frees the key (idempotency_release, only if
     nothing can have been sent); COMPLETED / NOT_EXECUTED is its answer (idempotency_settle) */
  :: atomic { myinc == inc[r] && DB(r) && phase == 2 ->
       i = KEY(t);
       if
       :: res == R_UNCLAIMED && k_state[i] == K_INPROG && ABANDONED(i) ->
            k_state[i] = K_ABSENT; k_att[i] = NONE; DIRTY
       :: res == R_UNCLAIMED && !(k_state[i] == K_INPROG && ABANDONED(i)) -> skip
       :: res != R_UNCLAIMED && k_state[i] == K_INPROG ->
            k_state[i] = K_DONE;
            if
            :: res == R_COMPLETED -> k_answer[i] = ANS_COMPLETED
            :: else -> k_answer[i] = ANS_NOT_EXEC; SAY_NOT_EXEC(i)
            fi;
            DIRTY
       :: res != R_UNCLAIMED && k_state[i] != K_INPROG -> skip
       fi;
       printf("STEP settle r=%d a=%d k=%d resolution=%d\n", r, t, i, res);
       settling[t] = 0; phase = 0; t = NONE }
  od
}

/* ------------------------------------------------------------------------------------------
 * A client: retries key k with the same key, on any replica, until a final answer.
 * ------------------------------------------------------------------------------------------ */
proctype client(byte k)
{
  byte i = 0; byte a; byte r;
  do
  :: i < REQS(k) ->
       a = FIRST(k) + i; i++;
       r = 0;
       if
       :: a == 0 -> skip   /* the replicas are symmetric: the first request goes to replica 0 */
       :: else ->
            do
            :: r < NR - 1 -> r++
            :: break
            od
       fi;
       atomic {
         req_rep[a] = r; req_inc[a] = inc[r]; req_live[a] = 1;
         printf("STEP request a=%d k=%d to r=%d\n", a, k, r);
         run request(a, k, r)
       };
       if
       :: ans[a] == ANS_COMPLETED || ans[a] == ANS_NOT_EXEC -> break
       :: ans[a] == ANS_UNKNOWN || ans[a] == ANS_RETRY -> skip
       :: skip       /* the client gave up waiting: it retries while this one may still run */
       fi
  :: else -> break
  od;
  clients_done++
}

/* ------------------------------------------------------------------------------------------
 * Faults and the passage of time, each bounded, so every run ends.
 * ------------------------------------------------------------------------------------------ */
#ifdef GAP_RENEW_ALL
#define RENEWED(x) true
#else
#define RENEWED(x) (holds[x] == a_owner[x] + 1)
#endif
#define PAUSE(r) \
  :: atomic { npause < MAXPAUSE && UP(r) -> paused[r] = 1; npause++; \
              printf("STEP pause r=%d\n", r) } \
  :: atomic { paused[r] -> paused[r] = 0; printf("STEP resume r=%d\n", r) }
#define CRASH(r) \
  :: atomic { ncrash < MAXCRASH && !down[r] && !halted[r] -> \
              down[r] = 1; paused[r] = 0; inc[r]++; ncrash++; \
              i = 0; do :: i < NA -> if :: req_rep[i] == r -> unk[i] = 0 :: else -> skip fi; \
                                     if :: holds[i] == r + 1 -> holds[i] = 0 :: else -> skip fi; i++ \
                        :: else -> break od; \
              printf("STEP crash r=%d\n", r) } \
  :: atomic { down[r] -> down[r] = 0; starting[r] = 1; printf("STEP restart r=%d\n", r) }
#define PART(r) \
  :: atomic { npart < MAXPART && !parted[r] && UP(r) -> parted[r] = 1; npart++; \
              printf("STEP partition r=%d\n", r) } \
  :: atomic { parted[r] -> parted[r] = 0; printf("STEP heal r=%d\n", r) }
/* a lease lapses only while its owner cannot renew it (paused, crashed, cut off, halted, no
   database): otherwise the lease keeper renews it every third of a lease */
#define LAPSE(x) \
  :: atomic { a_state[x] == A_OPEN && !a_lapsed[x] && (STALLED(a_owner[x]) || !RENEWED(x)) -> \
              a_lapsed[x] = 1; DIRTY; printf("STEP lapse a=%d owner=%d\n", x, a_owner[x]) }
/* the grant's expiry plus the dispatch deadline passes: a send not landed by then never lands.
   A live replica sends and hears back well within it: it matters only for a send in flight, or
   an attempt whose request is stopped or gone */
#ifdef NOEXPIRE
#define EXPIRE(x)
#else
#define EXPIRE(x) \
  :: atomic { win[x] == W_OPEN && a_state[x] == A_OPEN && \
              (send[x] == S_INFLIGHT || !req_live[x] || STALLED(req_rep[x])) -> \
              win[x] = W_CLOSED; \
              if :: send[x] == S_INFLIGHT -> send[x] = S_LOST :: else -> skip fi; \
              printf("STEP window-closed a=%d\n", x) }
#endif
/* the provider executes a send in flight */
#define LAND(x) \
  :: atomic { send[x] == S_INFLIGHT && win[x] == W_OPEN -> \
              send[x] = S_LANDED; execs[KEY(x)]++; \
              printf("STEP execute a=%d k=%d execution=%d\n", x, KEY(x), execs[KEY(x)]); \
              assert(execs[KEY(x)] == 1 || EXCUSED(KEY(x))); \
              assert(!said_not_exec[KEY(x)] || EXCUSED(KEY(x))) }
/* a key's holder lease lapses while its request is stopped or gone before its attempt opened */
#define KLAPSE(k) \
  :: atomic { k_state[k] == K_INPROG && k_att[k] == NONE && !k_lapsed[k] && \
              (!req_live[k_holder[k]] || STALLED(req_rep[k_holder[k]])) -> \
              k_lapsed[k] = 1; DIRTY; printf("STEP key-lapse k=%d holder=%d\n", k, k_holder[k]) }

#ifdef ASYNC
#define COPY_TO_STANDBY(x) s_a_state[x] = a_state[x]; s_a_owner[x] = a_owner[x]; \
  s_a_epoch[x] = a_epoch[x]; s_a_lapsed[x] = a_lapsed[x]; s_a_claimed[x] = a_claimed[x]; \
  s_a_status[x] = a_status[x]; s_g_claimed[x] = g_claimed[x];
#define COPYK_TO_STANDBY(x) s_k_state[x] = k_state[x]; s_k_holder[x] = k_holder[x]; \
  s_k_lapsed[x] = k_lapsed[x]; s_k_att[x] = k_att[x]; s_k_answer[x] = k_answer[x];
#define PROMOTE(x) if :: g_claimed[x] && !s_g_claimed[x] -> lost[KEY(x)] = 1 :: else -> skip fi; \
  a_state[x] = s_a_state[x]; a_owner[x] = s_a_owner[x]; a_epoch[x] = s_a_epoch[x]; \
  a_lapsed[x] = s_a_lapsed[x]; a_claimed[x] = s_a_claimed[x]; a_status[x] = s_a_status[x]; \
  g_claimed[x] = s_g_claimed[x];
#define PROMOTEK(x) k_state[x] = s_k_state[x]; k_holder[x] = s_k_holder[x]; \
  k_lapsed[x] = s_k_lapsed[x]; k_att[x] = s_k_att[x]; k_answer[x] = s_k_answer[x];
#endif

active proctype env()
{
  byte i;
end_env:
  do
  FORR(PAUSE)
  FORR(CRASH)
  FORR(PART)
  FORA(LAPSE)
  FORA(EXPIRE)
  FORA(LAND)
  FORK(KLAPSE)
  /* the primary is lost ... */
  :: atomic { nfail < MAXFAIL && !dbdown -> dbdown = 1; nfail++; printf("STEP primary-lost\n") }
#ifdef ASYNC
  /* ... the asynchronous standby catches up now and then ... */
  :: atomic { dirty && !dbdown -> FORA(COPY_TO_STANDBY) FORK(COPYK_TO_STANDBY) dirty = 0 }
  /* ... and is promoted with what it has: acknowledged writes after its last catch-up vanish */
  :: atomic { dbdown -> FORA(PROMOTE) FORK(PROMOTEK) dbdown = 0; dirty = 0;
              printf("STEP promote ASYNC lost=%d,%d\n", lost[0], lost[NK - 1]) }
#else
  /* ... and the synchronous standby is promoted: it has every acknowledged write */
  :: atomic { dbdown -> dbdown = 0; printf("STEP promote SYNC\n") }
#endif
  od
}

/* settled: a retry now replays the key's answer, or runs it afresh with nothing sent before,
   or reopens its attempt for reconciliation; and no attempt of the key is open */
#define OPEN_OF(x) || (a_state[x] == A_OPEN && KEY(x) == kk)
#define SETTLED(kk) (blocked[kk] || ( \
  (k_state[kk] != K_INPROG || ABANDONED(kk) || UNANSWERED(kk)) && !(false FORA(OPEN_OF))))
#if defined(ASYNC) || defined(NOEXPIRE)
/* with lost writes only detection is promised: a key may stay IN_PROGRESS (for example an
   attempt's STILL_UNKNOWN status vanished, so nobody asks again until its owner restarts);
   without grant expiry an attempt may stay STILL_UNKNOWN for ever */
#define CHECK_SETTLED(kk) skip;
#else
#define CHECK_SETTLED(kk) assert(SETTLED(kk));
#endif
#ifdef ASYNC
#define DETECTED(x) assert(!(j_claimed[x] && !g_claimed[x]) || halted[req_rep[x]]);
#endif

/* when nothing can move any more, every key is settled */
active proctype quiescence()
{
  byte kk;
  timeout ->
  printf("STEP quiescent\n");
  kk = 0; CHECK_SETTLED(0)
#if NK == 2
  kk = 1; CHECK_SETTLED(1)
#endif
#ifdef ASYNC
  FORA(DETECTED)
#endif
  assert(clients_done == NK)
}

init
{
  byte i;
  atomic {
    i = 0;
    do
    :: i < NK -> k_att[i] = NONE; i++
    :: else -> break
    od;
#ifdef ASYNC
    i = 0;
    do
    :: i < NK -> s_k_att[i] = NONE; i++
    :: else -> break
    od;
#endif
    i = 0;
    do
    :: i < NR -> run keeper(i); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NK -> run client(i); i++
    :: else -> break
    od
  }
}
