# Sourced by run.sh, test.sh and bench/run.sh: where built templates are kept, one cache for all
# three, so that the templates one of them built are not built again by the next (the first
# build of the two built-in ones takes minutes). Built templates are keyed by their recipe's
# hash, and each data dir's database is recorded in the cache, so data dirs share it safely.
export AIRLOCK_TEMPLATES_DIR=${AIRLOCK_TEMPLATES_DIR:-/var/cache/airlock/templates}
