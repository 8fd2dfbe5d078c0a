// The host of every rank, gathered once (collective over `world`), so that every report that
// names a rank also names the machine to pull: "rank 5 (node017)".
#pragma once
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace vidit {

// host_name() of every rank of `world`, by rank (names longer than 63 bytes are cut).
std::vector<std::string> gather_hosts(Comm& world);

// "rank R (host)", or "rank R" when the host is not known.
std::string rank_and_host(int rank, const std::vector<std::string>& hosts);

}  // namespace vidit
