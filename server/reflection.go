package server

import (
	_ "embed"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
	rpbv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	rpbv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// allocdDescriptors is the allocd.v1 API as `buf build` compiles it, with the source
// comments that protoc-gen-go leaves out of the generated code: with it, `grpcurl
// describe` shows operators the documentation of every RPC and field. `make proto`
// writes it; `make test` fails when it is stale.
//
//go:embed allocd.binpb
var allocdDescriptors []byte

// registerReflection serves reflection v1 and v1alpha, resolving allocd's files from
// allocdDescriptors and everything else from the global registry.
func registerReflection(gs *grpc.Server) error {
	files, err := documentedFiles()
	if err != nil {
		return err
	}
	opts := reflection.ServerOptions{Services: gs, DescriptorResolver: files}
	rpbv1.RegisterServerReflectionServer(gs, reflection.NewServerV1(opts))
	rpbv1alpha.RegisterServerReflectionServer(gs, reflection.NewServer(opts))
	return nil
}

// resolver finds allocd's documented descriptors first, then the global registry's.
type resolver struct{ local *protoregistry.Files }

func (r resolver) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	if fd, err := r.local.FindFileByPath(path); err == nil {
		return fd, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(path)
}

func (r resolver) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.local.FindDescriptorByName(name); err == nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(name)
}

func documentedFiles() (resolver, error) {
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(allocdDescriptors, &set); err != nil {
		return resolver{}, fmt.Errorf("allocd descriptors: %w", err)
	}
	local := new(protoregistry.Files)
	for _, fdp := range set.GetFile() {
		fd, err := protodesc.NewFile(fdp, resolver{local})
		if err != nil {
			return resolver{}, fmt.Errorf("allocd descriptor %s: %w", fdp.GetName(), err)
		}
		if err := local.RegisterFile(fd); err != nil {
			return resolver{}, fmt.Errorf("allocd descriptor %s: %w", fdp.GetName(), err)
		}
	}
	return resolver{local}, nil
}
