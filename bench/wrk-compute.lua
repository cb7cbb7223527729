-- CPU load: POST /api/compute with n=32, over and over.
wrk.method = "POST"
wrk.body = '{"n":32}'
wrk.headers["Content-Type"] = "application/json"
