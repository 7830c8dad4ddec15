// A namespace of store keys that belongs to one attempt of a group alone.
//
// A store may outlive the processes that wrote into it: torchrun's agent keeps
// one TCPStore for all restarts of a job (static rendezvous, and the c10d
// rendezvous's shared store), so a restarted rank finds every key of the
// attempts before it, among them the worker addresses of dead processes. Keys
// named after the rank alone cannot tell the two apart: a rank that reads
// before its peer has written gets the dead one's value.
//
// agree_session() gives every rank of the group the same id, drawn at random
// by rank 0 of this attempt, with a proof that every rank joined this very
// attempt. Keys under "<prefix>/session/":
//   leader                 rank 0's id (its latest attempt's; may be stale)
//   <id>/join/<rank>       rank's own random nonce, written for leader id <id>
//   <id>/members           the nonces of ranks 1..size-1, written by rank 0
//                          once each joined <id>
// A rank other than 0 reads `leader`, joins that id and waits for its
// members. Members that do not list its own nonce, or none yet while
// `leader` has meanwhile changed, mean that it read a dead attempt's id: it
// reads `leader` again. Nonces are random, so nothing of an earlier attempt
// can pass for this one; what rank 0 writes under <id> is fresh because <id>
// is. Put every other key of the group under "<prefix>/<id>/".
//
// What no protocol over a shared store can rule out: a process of an earlier
// attempt that is still alive and still joining. Launchers stop every worker
// of an attempt before they start the next.
#pragma once

#include <chrono>
#include <string>

#include "transport/store.hpp"

namespace dlop::transport {

// Every rank of the group (0..size-1) calls it once per attempt with the same
// prefix. Returns the session id (16 hex digits). Throws kTimeout naming the
// ranks rank 0 still waits for, or on another rank what it last saw.
std::string agree_session(Store& store, const std::string& prefix, int rank, int size,
                          std::chrono::milliseconds timeout);

}  // namespace dlop::transport
