// Connection setup of a Communicator (Communicator::create): the main transport between all
// ranks, routed through shared memory for collectives within a node where allowed, and the
// groups of a hierarchical topology. Every rank publishes its addresses through the
// store under the communicator's id and connects the full mesh of each group; runs on the
// creating thread, before any of the communicator's threads exist.
#pragma once

#include <memory>
#include <string>

#include "collectives/algorithm.h"
#include "collectives/communicator.h"
#include "collectives/topology.h"
#include "common/deadline.h"
#include "common/status.h"
#include "transports/routed/routed_transport.h"
#include "transports/transport.h"

namespace nanoccl::detail {

// The transport between all ranks (see connect.cc); *routedOut is set when it routes.
Result<std::unique_ptr<Transport>> connectMain(const CommunicatorOptions& options,
                                               const TransportChoice& choice,
                                               const Topology& topo, const std::string& secret,
                                               const Deadline& deadline,
                                               routed::RoutedTransport** routedOut);

// The local and cross groups of a hierarchical topology, on `main` (the transport between all
// ranks) or, for a cross group on a rail of its own, on a transport they connect.
Result<std::unique_ptr<Hierarchy>> connectHierarchy(const CommunicatorOptions& options,
                                                    const TransportChoice& choice,
                                                    const Topology& topo, Transport* main,
                                                    const std::string& secret,
                                                    const Deadline& deadline);

}  // namespace nanoccl::detail
