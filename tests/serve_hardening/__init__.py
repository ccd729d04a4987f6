"""`evolve serve` under hostile or unlucky requests (issue #57, second round): a database URL is served, ids no row
can have answer 404, a page of another host name (DNS rebinding) is refused, slow clients are bounded, a failed
rebuild does not freeze the page, concurrent first requests for a run share one build, a client that trickles its
request a byte at a time is dropped at the head deadline, and a damaged archive is a one-line 503 until restored.

Each test ends by reading the known programs back through the server and asserting their exact code and score
vectors: whatever came before, the server still answers honest requests with what the archive holds.

Split by what they check: test_addresses_and_ids.py (what is served, to which host names and addresses, and ids no
row can have), test_slow_clients.py (bounded connections, idle and trickling clients), test_damaged_archive.py,
test_live_builds.py (rebuilds and first builds, in process). The archive and `evolve serve` are conftest.py's;
the bounds and helpers served.py's.
"""
