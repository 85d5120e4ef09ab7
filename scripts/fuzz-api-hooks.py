"""schemathesis hooks of scripts/fuzz-api.

Stream ingest takes NDJSON (`application/x-ndjson`), which schemathesis has no serializer
for: the generated text is sent as it is, as for `text/plain`.
"""

import schemathesis

schemathesis.serializer.alias("application/x-ndjson", "text/plain")
