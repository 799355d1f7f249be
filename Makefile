# Common tasks. CI runs .ci/run, which does all of `make check`.

SQLC := bin/sqlc

.PHONY: test check lint generate sqlc-diff fault fuzz bench example chaos chaos-long chaos-cluster rules

test:            ## the README's test command: starts or installs what the tests need, then go test -race ./...
	bash .ci/test

check: sqlc-diff ## formatting, vet, generated code, tests, fuzz and fault steps
	bash .ci/run

lint:            ## golangci-lint with the import rules of .golangci.yml
	cd tools/lint && go build -o ../../bin/golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	bin/golangci-lint run ./...

$(SQLC): tools/go.mod tools/go.sum
	cd tools && go build -o ../$(SQLC) github.com/sqlc-dev/sqlc/cmd/sqlc

generate: $(SQLC) ## regenerate store/internal/dbsqlc from queries/ and the migrations
	$(SQLC) generate

sqlc-diff: $(SQLC)
	$(SQLC) diff

fault:           ## tests that restart PostgreSQL or RabbitMQ (run alone)
	go test -race -count=1 -p 1 -tags fault -run 'Restart|Restarts' ./internal/relay ./participant ./transport/rabbitmq

rules:           ## check and unit-test the Prometheus alert rules in deploy/ (promtool: Debian package prometheus)
	promtool check rules deploy/prometheus/sagabox.rules.yml
	cd deploy/prometheus && promtool test rules sagabox.rules.test.yml

fuzz:            ## a longer fuzz run of envelope decoding
	go test -run '^$$' -fuzz '^FuzzDecodeDelivery$$' -fuzztime 5m ./transport/rabbitmq

bench:           ## relay throughput and latency against raw ceilings, in one run
	go run ./cmd/sagabox bench relay --database-url postgres://postgres@127.0.0.1:5432/sagabox_test

example:
	go run ./examples/checkout

chaos:           ## the chaos run, short form: private servers, 500 sagas under kills and restarts (see docs/chaos.md)
	go run ./cmd/chaos

chaos-long:      ## the chaos run, long form: 10,000 sagas, 24 kills, 3 broker and 2 database restarts
	go run ./cmd/chaos -long

chaos-cluster:   ## the chaos run against a three-node RabbitMQ cluster, killing the node leading the queues
	go run ./cmd/chaos -cluster
