#!/usr/bin/env bash
# Procfile `s3`: dev-s3 serving bucket "dev" from temp/dev-s3 on 127.0.0.1:8989.
source "$(dirname "$0")/dev-common.sh"
need_bin dev-s3
mkdir -p "$DEV_DIR/dev-s3"
exec bin/dev-s3 --addr "$DEV_S3_ADDR" --bucket "$DEV_BUCKET" --dir "$DEV_DIR/dev-s3"
