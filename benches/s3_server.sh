# Sourced by the S3 benches: starts s3s-fs on a free loopback port with bucket "bench" under
# "$work/s3data", points the AWS_* variables at it, and stops it (and removes "$work") on exit.
S3S=$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/s3data/bench"
"$S3S" --host 127.0.0.1 --port "$port" --access-key benchkey --secret-key benchsecret0123456789 "$work/s3data" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$work"' EXIT
export AWS_ENDPOINT="http://127.0.0.1:$port" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=benchkey AWS_SECRET_ACCESS_KEY=benchsecret0123456789 AWS_REGION=us-east-1
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
