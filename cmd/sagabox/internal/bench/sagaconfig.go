package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// The pipelines RunSagas measures, as SagaConfig.Only names them.
const (
	// PipelineEngine is sagabox: an orchestrator and two participant clients.
	PipelineEngine = "engine"
	// PipelineBaseline is the hand-written pipeline, one transaction per
	// message.
	PipelineBaseline = "baseline"
	// PipelineGroup is the hand-written pipeline with group-commit consumers.
	PipelineGroup = "group"
)

// Defaults of SagaConfig.
const (
	DefaultSagas       = 2000
	DefaultConcurrency = 8
	DefaultPoolSize    = 16
	DefaultWorkers     = 8
	// DefaultParticipantBatch is the engine's participants' MaxBatch.
	DefaultParticipantBatch = participant.MaxBatchLimit
	DefaultDuration         = 10 * time.Second
	// DefaultRepeat is how many open-loop runs each pipeline has at each
	// rate.
	DefaultRepeat = 1
	// DefaultAMQPURL is the broker used when SagaConfig.AMQPURL is empty.
	DefaultAMQPURL = rabbitmq.DefaultURL
)

// SagaConfig configures RunSagas.
type SagaConfig struct {
	// DatabaseURL locates PostgreSQL. Required.
	DatabaseURL string
	// AMQPURL locates RabbitMQ. Defaults to DefaultAMQPURL.
	AMQPURL string
	// Sagas is the number of sagas of each saturated run. Defaults to
	// DefaultSagas (2000).
	Sagas int
	// Concurrency is the number of goroutines starting sagas, as fast as
	// they can, in a saturated run. Defaults to DefaultConcurrency (8).
	Concurrency int
	// PoolSize is the size of each pipeline's one connection pool: the
	// engine's three clients share theirs, the baselines have one each.
	// Defaults to DefaultPoolSize (16).
	PoolSize int
	// Workers is how many deliveries of one queue are handled at once: each
	// engine client's Workers, and the baseline's consumer goroutines per
	// queue. The group-commit baseline runs GroupConsumers consumers per
	// queue instead. Defaults to DefaultWorkers (8).
	Workers int
	// ParticipantBatch is the engine's participants' Config.MaxBatch
	// (group commit, which participants opt into); 1 handles each command
	// in a transaction of its own. The orchestrator runs its default
	// MaxBatch. Defaults to DefaultParticipantBatch (32).
	ParticipantBatch int
	// Linger is the engine clients' BatchLinger: how long a batch waits
	// for more deliveries once they come faster than one at a time.
	// Defaults to transport.DefaultLinger (2ms).
	Linger time.Duration
	// MaxRunning is the engine orchestrator's Admission.MaxRunning (flow
	// control): 0 its default, negative no limit.
	MaxRunning int
	// QueueType is the type of every queue, the engine's and the
	// baselines'. Defaults to rabbitmq.DefaultQueueType (quorum).
	QueueType rabbitmq.QueueType
	// Only restricts the run to these pipelines, of PipelineEngine,
	// PipelineBaseline and PipelineGroup; they run in that order whatever
	// the order here. Defaults to all three, and in a sweep (Rates) to the
	// engine and the baseline.
	Only []string
	// Rates makes the run a latency sweep: open-loop runs only, at each of
	// these start rates in sagas per second, Repeat runs of each pipeline
	// alternating (engine, baseline, engine, baseline, …), each on fresh
	// schemas and queues. Defaults to none: the saturated runs, then one
	// such sweep at half the engine's saturated rate (none without the
	// engine).
	Rates []float64
	// Repeat is how many open-loop runs each pipeline has at each rate; the
	// report gives each run and their medians. Defaults to DefaultRepeat
	// (1).
	Repeat int
	// Duration is how long each open-loop run starts sagas. Defaults to
	// DefaultDuration (10s).
	Duration time.Duration
	// Replicas makes the run a measurement of orchestrator replicas
	// instead: for each count n, the engine saturated with its orchestrator
	// in n processes of their own (ReplicaCommand) on one database, the
	// participants and the sagas' starts in this process. Defaults to none.
	Replicas []int
	// ReplicaCommand is the command line that starts one orchestrator
	// replica: a process that reads a ReplicaSpec as JSON on its stdin and
	// runs RunOrchestratorReplica (`sagabox bench orchestrator-replica`).
	// Required with Replicas.
	ReplicaCommand []string
	// KeepSchemas leaves the engine's schemas in place after the run, for
	// inspection (saga history, inbox timestamps); drop them yourself.
	KeepSchemas bool
	// Log receives progress lines and the engine's error logs. Defaults to
	// none.
	Log io.Writer
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c SagaConfig) WithDefaults() SagaConfig {
	if c.AMQPURL == "" {
		c.AMQPURL = DefaultAMQPURL
	}
	if c.Sagas == 0 {
		c.Sagas = DefaultSagas
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.PoolSize == 0 {
		c.PoolSize = DefaultPoolSize
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.ParticipantBatch == 0 {
		c.ParticipantBatch = DefaultParticipantBatch
	}
	if c.QueueType == "" {
		c.QueueType = rabbitmq.DefaultQueueType
	}
	if c.Linger == 0 {
		c.Linger = transport.DefaultLinger
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Repeat == 0 {
		c.Repeat = DefaultRepeat
	}
	return c
}

// Validate checks a config that went through WithDefaults; its errors name
// the field at fault.
func (c SagaConfig) Validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("DatabaseURL is required"))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"Sagas", c.Sagas}, {"Concurrency", c.Concurrency}, {"PoolSize", c.PoolSize}, {"Workers", c.Workers}} {
		if f.v < 1 || f.v > 1_000_000 {
			errs = append(errs, fmt.Errorf("%s %d: want 1 to 1000000", f.name, f.v))
		}
	}
	if c.ParticipantBatch < 1 || c.ParticipantBatch > participant.MaxBatchLimit {
		errs = append(errs, fmt.Errorf("ParticipantBatch %d: want 1 to %d", c.ParticipantBatch, participant.MaxBatchLimit))
	}
	if c.QueueType != rabbitmq.QueueTypeQuorum && c.QueueType != rabbitmq.QueueTypeClassic {
		errs = append(errs, fmt.Errorf("QueueType %q: want %q or %q", c.QueueType, rabbitmq.QueueTypeQuorum, rabbitmq.QueueTypeClassic))
	}
	for _, p := range c.Only {
		if !slices.Contains(pipelines, p) {
			errs = append(errs, fmt.Errorf("Only %q: want %q, %q or %q", p, PipelineEngine, PipelineBaseline, PipelineGroup))
		}
	}
	for _, r := range c.Rates {
		if !(r > 0) || math.IsInf(r, 0) || r > 1_000_000 {
			errs = append(errs, fmt.Errorf("Rates %v: want positive rates up to 1000000 sagas/s", c.Rates))
			break
		}
	}
	if c.Repeat < 1 || c.Repeat > 100 {
		errs = append(errs, fmt.Errorf("Repeat %d: want 1 to 100", c.Repeat))
	}
	if c.Duration < 0 {
		errs = append(errs, fmt.Errorf("Duration %s: want a positive duration", c.Duration))
	}
	for _, n := range c.Replicas {
		if n < 1 || n > MaxReplicas {
			errs = append(errs, fmt.Errorf("Replicas %v: want counts from 1 to %d", c.Replicas, MaxReplicas))
			break
		}
	}
	if len(c.Replicas) > 0 {
		if len(c.Rates) > 0 {
			errs = append(errs, errors.New("Rates and Replicas: choose one measurement"))
		}
		if len(c.Only) > 0 {
			errs = append(errs, errors.New("Only: the replicas measurement runs the engine only"))
		}
		if len(c.ReplicaCommand) == 0 || c.ReplicaCommand[0] == "" {
			errs = append(errs, errors.New("ReplicaCommand is required with Replicas"))
		}
	}
	if c.Linger < 0 {
		errs = append(errs, fmt.Errorf("Linger %s: want a positive duration", c.Linger))
	}
	return errors.Join(errs...)
}

// pipelines are the pipelines in the order they run.
var pipelines = []string{PipelineEngine, PipelineBaseline, PipelineGroup}

// pipelines returns the pipelines the run measures, in the order they run:
// Only's, else all three, or in a sweep the engine and the baseline.
func (c SagaConfig) pipelines() []string {
	var out []string
	for _, p := range pipelines {
		switch {
		case len(c.Only) > 0 && slices.Contains(c.Only, p),
			len(c.Only) == 0 && (len(c.Rates) == 0 || p != PipelineGroup):
			out = append(out, p)
		}
	}
	return out
}
