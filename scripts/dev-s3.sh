#!/usr/bin/env bash
# Procfile `s3`: dev-s3 serving bucket "dev" from temp/dev-s3 on 127.0.0.1:8989,
# requiring requests signed with the keys of temp/dev-s3.credentials.
source "$(dirname "$0")/dev-common.sh"
need_bin dev-s3
mkdir -p "$DEV_DIR/dev-s3"
# The keys from dev-common.sh (dev_s3_keys), passed in the environment so
# that other users' ps does not show them.
DEV_S3_ACCESS_KEY=$AWS_ACCESS_KEY_ID DEV_S3_SECRET_KEY=$AWS_SECRET_ACCESS_KEY \
	exec bin/dev-s3 --addr "$DEV_S3_ADDR" --bucket "$DEV_BUCKET" --dir "$DEV_DIR/dev-s3"
