"""Where each replica's batches come from.

    pipelines.py  which input pipelines a topology has, and the pieces of
                  every global batch each keeps (one host, in-graph, between-graph)
    pieces.py     cutting a global batch into the replicas' pieces
    iterators.py  the distributed dataset and iterator handed to Keras: plain
                  `tf.data` iterators, the cut inside the compiled step

What a replica does with a piece, including a replica left without one, is
`keras_psdist.distribute.replica_batches`.
"""

from keras_psdist.distribute.input.pipelines import InputPipelines

__all__ = ["InputPipelines"]
