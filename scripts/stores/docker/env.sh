# shellcheck shell=sh
# The URIs of the stores run by docker-compose.yml (same ports and
# credentials as scripts/stores/start.sh). Source it:
#   . scripts/stores/docker/env.sh
export DLOCK_REDIS_URI=redis://127.0.0.1:6390/0
export DLOCK_REDIS_AUTH_URI=redis://:dlock-secret-pw@127.0.0.1:6396/0
export DLOCK_REDLOCK_URI=redis://127.0.0.1:6391,127.0.0.1:6392,127.0.0.1:6393,127.0.0.1:6394,127.0.0.1:6395/0
export DLOCK_POSTGRES_URI=postgresql://dlock@127.0.0.1:5440/dlock
export DLOCK_POSTGRES_AUTH_URI=postgresql://dlock_pw:dlock-secret-pw@127.0.0.1:5440/dlock
export DLOCK_MYSQL_URI=mysql://dlock:dlock-secret-pw@127.0.0.1:3310/dlock
export DLOCK_ZK_URI=zookeeper://127.0.0.1:2181/dlock
export DLOCK_ZK_ENSEMBLE_URI=zookeeper://127.0.0.1:2191,127.0.0.1:2192,127.0.0.1:2193/dlock
export DLOCK_REDIS_CLUSTER_URI=redis+cluster://:dlock-secret-pw@127.0.0.1:6400,127.0.0.1:6401,127.0.0.1:6402
export DLOCK_REDIS_CLUSTER_PORTS="6400 6401 6402 6403 6404 6405"
export DLOCK_REDIS_SENTINEL_URI='redis+sentinel://:dlock-secret-pw@127.0.0.1:26410,127.0.0.1:26411,127.0.0.1:26412/dlock-primary/0?sentinel_password=dlock-secret-pw'
export DLOCK_REDIS_SENTINEL_DATA_PORTS="6410 6411 6412"
export DLOCK_REDIS_SENTINEL_PORTS="26410 26411 26412"
export DLOCK_ETCD_URI=etcd://dlock:dlock-secret-pw@127.0.0.1:2379/dlock
export DLOCK_ETCD_CLUSTER_URI=etcd://127.0.0.1:2479,127.0.0.1:2481,127.0.0.1:2483/dlock
