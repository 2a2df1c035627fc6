"""The eigensolver's cost model after its split out of ``furnace.eigen.scaling``
(`furnace.eigen.costmodel`, `.sc18`, the analytic parts of `.scaling_experiments`): every
value below was computed by the pre-split module (commit bc938a5) with the same inputs, and
must come out the same to 1e-12 relative now that the alpha-beta terms go through
`furnace.runtime.cost` and the Stampede2-class network through
`furnace.runtime.presets.stampede2_skx`."""

from __future__ import annotations

import math

import pytest
import torch

from furnace.eigen.costmodel import (
    ClusterAssumptions,
    ScalingModel,
    Workload,
    amdahl_fit,
    calibrate_to_anchor,
)
from furnace.eigen.sc18 import SC18_C3, SC18_NNZ_A_PER_ROW, SC18_NNZ_M_PER_ROW, sc18_workload
from furnace.eigen.scaling_experiments import (
    DOFS_PER_RANK_GRID,
    efficiency_crossing,
    project_c3,
    ranks_for,
    sc18_data_rows,
    sensitivity_rows,
)
from furnace.runtime.testing import max_relative_error

RTOL = 1e-12
PROCESSES = [1, 2, 16, 192, 1024]

# printed by furnace.eigen.scaling at bc938a5 for the WORKS and MODELS below (the C3 tables:
# sc18_model's own expressions for the "c3" workload), repr-exact
PRE_SPLIT = {'models': {'plain/consistent': {'seconds': [762.6666666666667, 415.7324651884378,
                                                 62.38844963044278, 11.852255005320538,
                                                 7.546103101902674],
                                     'exchange_seconds': [0.0, 0.00013229204559655548,
                                                          5.657301139913887e-05,
                                                          3.021446501190772e-05,
                                                          2.603581321244618e-05],
                                     'a_matvec_seconds': [0.008, 0.004132292045596555,
                                                          0.0005565730113991389,
                                                          7.188113167857439e-05,
                                                          3.384831321244618e-05],
                                     'parallel_efficiency': [1.0, 0.9172565658553694,
                                                             0.7640303124860386, 0.335144849688019,
                                                             0.09869884582929632],
                                     'strong_efficiency': [1.0, 0.9172565658553694,
                                                           0.7640303124860386, 0.335144849688019,
                                                           0.09869884582929632],
                                     'strong_efficiency_ref16': [1.3088485936456526,
                                                                 1.2005499662320411, 1.0,
                                                                 0.43865386518174726,
                                                                 0.12918184555812356],
                                     'measured_2': 381.3375533333334,
                                     'measured_16': 47.68078666666668},
                'plain/lumped': {'seconds': [96.0, 49.32612045596555, 6.578530113991389,
                                             0.8264165301213849, 0.3861081321244618],
                                 'exchange_seconds': [0.0, 0.00013229204559655548,
                                                      5.657301139913887e-05, 3.021446501190772e-05,
                                                      2.603581321244618e-05],
                                 'a_matvec_seconds': [0.008, 0.004132292045596555,
                                                      0.0005565730113991389, 7.188113167857439e-05,
                                                      3.384831321244618e-05],
                                 'parallel_efficiency': [1.0, 0.9731152492085932,
                                                         0.9120578451467515, 0.6050217799086853,
                                                         0.24280762874421852],
                                 'strong_efficiency': [1.0, 0.9731152492085932, 0.9120578451467515,
                                                       0.6050217799086853, 0.24280762874421852],
                                 'strong_efficiency_ref16': [1.0964216856652316, 1.0669446618838276,
                                                             1.0, 0.6633589997916596,
                                                             0.2662195496001138],
                                 'measured_2': 48.00422,
                                 'measured_16': 6.01412},
                'plain/c3': {'seconds': [791215.7068010496, 405141.6143872553, 51983.90764974822,
                                         4727.730964644698, 1074.1537660905635],
                             'exchange_seconds': [0.0, 0.0014990630098786735, 0.0003982657524696684,
                                                  9.540455622532822e-05, 4.7391609529354284e-05],
                             'a_matvec_seconds': [0.3404040342000001, 0.17170108010987872,
                                                  0.021673517889969674, 0.0018683422343503287,
                                                  0.00037981742417779186],
                             'parallel_efficiency': [1.0, 0.9764680777087056, 0.9512748062006284,
                                                     0.8716475557526777, 0.7193305214439428],
                             'strong_efficiency': [1.0, 0.9764680777087056, 0.9512748062006284,
                                                   0.8716475557526777, 0.7193305214439428],
                             'strong_efficiency_ref16': [1.0512209442337477, 1.026483694663058, 1.0,
                                                         0.9162941665973681, 0.7561753099684556],
                             'measured_2': 395607.8576205248,
                             'measured_16': 49450.9957950656},
                'overhead/consistent': {'seconds': [491.7333333333334, 280.22895246981346,
                                                    66.31690478412003, 36.73413578592624,
                                                    34.438481549007506],
                                        'exchange_seconds': [0.0, 0.00013214417616594907,
                                                             0.00013678604404148727,
                                                             0.00013129468021081411,
                                                             0.00013042412775259298],
                                        'a_matvec_seconds': [0.005200000000000001,
                                                             0.0027321441761659496,
                                                             0.0004617860440414873,
                                                             0.00015837801354414745,
                                                             0.000135502252752593],
                                        'parallel_efficiency': [1.0, 0.8773778173158311,
                                                                0.46343135937026747,
                                                                0.0697201950261298,
                                                                0.013943946182701911],
                                        'strong_efficiency': [1.0, 0.8773778173158311,
                                                              0.46343135937026747,
                                                              0.0697201950261298,
                                                              0.013943946182701911],
                                        'strong_efficiency_ref16': [2.157816858485467,
                                                                    1.8932206454652825, 1.0,
                                                                    0.15044341220427748,
                                                                    0.030088482146848256],
                                        'measured_2': 271.8681966666667,
                                        'measured_16': 56.741313333333345},
                'overhead/lumped': {'seconds': [58.4, 30.526241761659488, 5.037060440414872,
                                                1.6535212887782695, 1.40927252752593],
                                    'exchange_seconds': [0.0, 0.00013214417616594907,
                                                         0.00013678604404148727,
                                                         0.00013129468021081411,
                                                         0.00013042412775259298],
                                    'a_matvec_seconds': [0.005200000000000001,
                                                         0.0027321441761659496,
                                                         0.0004617860440414873,
                                                         0.00015837801354414745,
                                                         0.000135502252752593],
                                    'parallel_efficiency': [1.0, 0.9565540438284404,
                                                            0.7246289861273476, 0.18395086215757464,
                                                            0.040468574307711856],
                                    'strong_efficiency': [1.0, 0.9565540438284404,
                                                          0.7246289861273476, 0.18395086215757464,
                                                          0.040468574307711856],
                                    'strong_efficiency_ref16': [1.380016559017773,
                                                                1.3200604200786605, 1.0,
                                                                0.25385523582304886,
                                                                0.05584730266448358],
                                    'measured_2': 30.201529999999998,
                                    'measured_16': 4.657979999999999},
                'overhead/c3': {'seconds': [510772.5660481383, 258037.623565638, 33245.99595340086,
                                            3581.74875002344, 1356.6902809933983],
                                'exchange_seconds': [0.0, 0.00041688812705805697,
                                                     0.00020797203176451426, 0.00014487594921361007,
                                                     0.00013487325198528215],
                                'a_matvec_seconds': [0.22126262223000004, 0.11104819924205808,
                                                     0.014036885921139516, 0.0012972854399948602,
                                                     0.00035095003150676653],
                                'parallel_efficiency': [1.0, 0.9897249846556023, 0.9602144397404672,
                                                        0.7427304278345349, 0.3676604314332906],
                                'strong_efficiency': [1.0, 0.9897249846556023, 0.9602144397404672,
                                                      0.7427304278345349, 0.3676604314332906],
                                'strong_efficiency_ref16': [1.0414340366202848, 1.0307332859138334,
                                                            1.0, 0.7735047475804309,
                                                            0.3828940872131273],
                                'measured_2': 256022.26535406915,
                                'measured_16': 32559.274158008644},
                'no_network/consistent': {'seconds': [376.53333333333336, 188.26666666666668,
                                                      23.533333333333335, 1.9611111111111112,
                                                      0.36770833333333336],
                                          'exchange_seconds': [0.0, 0.0, 0.0, 0.0, 0.0],
                                          'a_matvec_seconds': [0.004, 0.002, 0.00025,
                                                               2.0833333333333333e-05,
                                                               3.90625e-06],
                                          'parallel_efficiency': [1.0, 1.0, 1.0, 1.0, 1.0],
                                          'strong_efficiency': [1.0, 1.0, 1.0, 1.0, 1.0],
                                          'strong_efficiency_ref16': [1.0, 1.0, 1.0, 1.0, 1.0],
                                          'measured_2': 188.26666666666668,
                                          'measured_16': 23.533333333333335},
                'no_network/lumped': {'seconds': [43.2, 21.6, 2.7, 0.225, 0.0421875],
                                      'exchange_seconds': [0.0, 0.0, 0.0, 0.0, 0.0],
                                      'a_matvec_seconds': [0.004, 0.002, 0.00025,
                                                           2.0833333333333333e-05, 3.90625e-06],
                                      'parallel_efficiency': [1.0, 1.0, 1.0, 1.0, 1.0],
                                      'strong_efficiency': [1.0, 1.0, 1.0, 1.0, 1.0],
                                      'strong_efficiency_ref16': [1.0, 1.0, 1.0, 1.0, 1.0],
                                      'measured_2': 21.6,
                                      'measured_16': 2.7},
                'no_network/c3': {'seconds': [391386.681353472, 195693.340676736, 24461.667584592,
                                              2038.472298716, 382.21355600925],
                                  'exchange_seconds': [0.0, 0.0, 0.0, 0.0, 0.0],
                                  'a_matvec_seconds': [0.17020201710000005, 0.08510100855000002,
                                                       0.010637626068750003, 0.0008864688390625002,
                                                       0.0001662129073242188],
                                  'parallel_efficiency': [1.0, 1.0, 1.0, 1.0, 1.0],
                                  'strong_efficiency': [1.0, 1.0, 1.0, 1.0, 1.0],
                                  'strong_efficiency_ref16': [1.0, 1.0, 1.0, 1.0, 1.0],
                                  'measured_2': 195693.340676736,
                                  'measured_16': 24461.667584592},
                'projection/consistent': {'seconds': [1412.8208767181877, 739.4545329399941,
                                                      102.68432844011178, 15.173844413215036,
                                                      8.15984686524667],
                                          'exchange_seconds': [0.0, 0.00012708036377269324,
                                                               5.527009094317331e-05,
                                                               2.996588641143141e-05,
                                                               2.5954380683948333e-05],
                                          'a_matvec_seconds': [0.01492416419068508,
                                                               0.007589162459115234,
                                                               0.0009880303528609908,
                                                               0.00010769590823791621,
                                                               4.052875977641423e-05],
                                          'parallel_efficiency': [1.0, 0.9553128784679696,
                                                                  0.8599297101737038,
                                                                  0.48494250144228634,
                                                                  0.16908502208495757],
                                          'strong_efficiency': [1.0, 0.9553128784679696,
                                                                0.8599297101737038,
                                                                0.48494250144228634,
                                                                0.16908502208495757],
                                          'strong_efficiency_ref16': [1.1628857430661423,
                                                                      1.1109197265378803, 1.0,
                                                                      0.563932721134067,
                                                                      0.196626561548621],
                                          'measured_2': 706.4144983590938,
                                          'measured_16': 88.31494479488673},
                'projection/lumped': {'seconds': [169.14052749443093, 85.8442673849424,
                                                  11.136783877833667, 1.2048709914834494,
                                                  0.4567201032207635],
                                      'exchange_seconds': [0.0, 0.00012708036377269324,
                                                           5.527009094317331e-05,
                                                           2.996588641143141e-05,
                                                           2.5954380683948333e-05],
                                      'a_matvec_seconds': [0.01492416419068508,
                                                           0.007589162459115234,
                                                           0.0009880303528609908,
                                                           0.00010769590823791621,
                                                           4.052875977641423e-05],
                                      'parallel_efficiency': [1.0, 0.9851591297061916,
                                                              0.9492222426478716,
                                                              0.7311490222552418,
                                                              0.3616575999533776],
                                      'strong_efficiency': [1.0, 0.9851591297061916,
                                                            0.9492222426478716, 0.7311490222552418,
                                                            0.3616575999533776],
                                      'strong_efficiency_ref16': [1.053494066058211,
                                                                  1.0378592972685443, 1.0,
                                                                  0.77026115635016,
                                                                  0.3810041354957376],
                                      'measured_2': 84.57432374721547,
                                      'measured_16': 10.584922968401933},
                'projection/c3': {'seconds': [1467279.491942456, 742792.6656256893,
                                              94142.68388801882, 8230.731741539457,
                                              1728.4216604510116],
                                  'exchange_seconds': [0.0, 0.0014391804894835264,
                                                       0.0003832951223708816, 9.254837397631508e-05,
                                                       4.6455945148180106e-05],
                                  'a_matvec_seconds': [0.6350307121965475, 0.3189545365877573,
                                                       0.0400727146346551, 0.0034000000000000002,
                                                       0.0006666031250276211],
                                  'parallel_efficiency': [1.0, 0.9876776924732403,
                                                          0.9741061594917462, 0.9284813218527924,
                                                          0.8290165308829551],
                                  'strong_efficiency': [1.0, 0.9876776924732403, 0.9741061594917462,
                                                        0.9284813218527924, 0.8290165308829551],
                                  'strong_efficiency_ref16': [1.026582154579296, 1.0139322935690862,
                                                              1.0, 0.9531623558742723,
                                                              0.8510535764556775],
                                  'measured_2': 733639.7500312281,
                                  'measured_16': 91704.9818864035}},
     'anchor': {'c_K': 3.73104104767127e-09,
                'c_R': 1.2436803492237567e-09,
                'alpha': 2e-06,
                'beta': 3.84e-09,
                'alpha_ar': 2e-06,
                'halo_coeff': 3.0,
                'max_neighbours': 12,
                'overhead': 0.0},
     'amdahl': [459.72857142857083, 1227803.7942857144],
     'amdahl_e3': [1988.986666666664, 6207416.32],
     'fit_compute': [9.177949425827484e-10, 0.0],
     'fit_link': [3.493308016666711e-06, 1.0190873339784168e-10],
     'sensitivity': [['as assumed', 0.8454127256834104, 0.4545685467470394],
                     ['latency 1 us', 0.8939657285220022, 0.4440685467470394],
                     ['latency 10 us', 0.598548747210374, 0.5385685467470394],
                     ['26 halo partners', 0.7520159160927162, 0.47906854674703936],
                     ['half the link bandwidth', 0.8142476252047778, 0.46313709349407867],
                     ['halo 3x larger', 0.7870666555044473, 0.47170564024111816]],
     'projection_rows': [[192, 20285, 6854.54, 1.0, 1.0, 3.4, 3.4000000000000004, 8230.731741539457,
                          1.0, 28.022550366300365, 33.648661292923606],
                         [384, 10142, 3247.78, 1.1, 1.055265442856351, 1.74, 1.7209085826662553,
                          4248.379088648042, 0.9686908312316729, 13.277488880167452,
                          17.368111789671808],
                         [768, 5071, 1779.14, 0.96, 0.9631816495610238, 0.69, 0.8780663467460993,
                          2236.241513804685, 0.9201523729357723, 7.273433411826269,
                          9.142143812977029],
                         [1536, 2535, 1259.08, 0.68, 0.6805107697684023, 0.36, 0.4545685467470394,
                          1216.9694593380323, 0.8454127256834104, 5.147337781266352,
                          4.975182575132588]],
     'data_rows': [['C3 constant ball', 3894783, 192, 6854.54, 1.0, 1.0, 3.4, 28.022550366300365],
                   ['C3 constant ball', 3894783, 384, 3247.78, 1.1, 1.055265442856351, 1.74,
                    13.277488880167454],
                   ['C3 constant ball', 3894783, 768, 1779.14, 0.96, 0.9631816495610238, 0.69,
                    7.273433411826271],
                   ['C3 constant ball', 3894783, 1536, 1259.08, 0.68, 0.6805107697684023, 0.36,
                    5.147337781266352],
                   ['E3 Earth', 4466349, 192, 34319.28, 1.0, 1.0, 7.92, 36.80904371701917],
                   ['E3 Earth', 4466349, 384, 16570.22, 1.0, 1.0355710425087898, 4.9,
                    17.77234115577674],
                   ['E3 Earth', 4466349, 768, 10071.56, 0.85, 0.8518859044676296, 3.78,
                    10.802222317559739]],
     'grid': [[100000.0, 39, 0.9637699162626092], [30000.0, 130, 0.9401841683605672],
              [10000.0, 389, 0.8987396027741336], [3000.0, 1298, 0.804526994078896],
              [1000.0, 3895, 0.6406063446502127], [300.0, 12983, 0.3870035310221276],
              [100.0, 38948, 0.18552657758131272]],
     'crossing': 2736.439997074669,
     'serial_s': 459.72857142857083}


def _work(n=100_000, steps=200, degree=50, consistent=True) -> Workload:
    a = float(degree * steps)
    return Workload(n=n, nnz_a=40.0 * n, nnz_m=(40.0 / 3 if consistent else 1.0) * n,
                    a_matvecs=a, m_matvecs=25 * a if consistent else 0.0,
                    allreduces=8.0 * steps, reorth_flops=4.0 * n * steps**2,
                    filter_degree=degree, filtered_matvecs=steps)


WORKS = {"consistent": _work(), "lumped": _work(consistent=False),
         "c3": sc18_workload(SC18_C3, nnz_a_per_row=SC18_NNZ_A_PER_ROW,
                             nnz_m_per_row=SC18_NNZ_M_PER_ROW, allreduces_per_step=6.0,
                             reorth_flops_per_nk2=8.0)}
MODELS = {"plain": ScalingModel(c_K=2e-9, c_R=1e-9, alpha=2e-6, beta=4e-9, alpha_ar=2e-6),
          "overhead": ScalingModel(c_K=1.3e-9, c_R=0.4e-9, alpha=5e-6, beta=1e-9,
                                   alpha_ar=3e-6, halo_coeff=2.5, max_neighbours=6,
                                   overhead=1e-4),
          "no_network": ScalingModel(c_K=1e-9, c_R=2e-10, alpha=0.0, beta=0.0, alpha_ar=0.0),
          "projection": calibrate_to_anchor(WORKS["c3"], 192, 3.40e-3)}


def _same(name, expected, actual):
    """Each number to RTOL of its own magnitude; an exact zero must stay exactly zero
    (one rank exchanges nothing), strings and integers must be equal."""
    assert len(expected) == len(actual), name
    for i, (e, a) in enumerate(zip(expected, actual)):
        if isinstance(e, str) or (isinstance(e, int) and not isinstance(e, bool)):
            assert e == a, f"{name}[{i}]: {a!r} != {e!r}"
        elif e == 0:
            assert a == 0, f"{name}[{i}]: {a!r} != 0"
        else:
            err = max_relative_error(torch.tensor([float(e)], dtype=torch.float64),
                                     torch.tensor([float(a)], dtype=torch.float64),
                                     scale=abs(e))
            assert err <= RTOL, f"{name}[{i}]: {a!r} vs {e!r} (relative {err:.2e})"


@pytest.mark.parametrize("key", list(PRE_SPLIT["models"]))
def test_model_times_and_efficiencies_unchanged(key):
    model_name, work_name = key.split("/")
    model, work = MODELS[model_name], WORKS[work_name]
    pinned = PRE_SPLIT["models"][key]
    _same(f"{key} seconds", pinned["seconds"], [model.seconds(work, p) for p in PROCESSES])
    _same(f"{key} exchange", pinned["exchange_seconds"],
          [model.exchange_seconds(work.n, p) for p in PROCESSES])
    _same(f"{key} A-matvec", pinned["a_matvec_seconds"],
          [model.a_matvec_seconds(work, p) for p in PROCESSES])
    _same(f"{key} parallel efficiency", pinned["parallel_efficiency"],
          [model.parallel_efficiency(work, p) for p in PROCESSES])
    _same(f"{key} strong efficiency", pinned["strong_efficiency"],
          model.strong_efficiency(work, PROCESSES).tolist())
    _same(f"{key} strong efficiency vs 16", pinned["strong_efficiency_ref16"],
          model.strong_efficiency(work, PROCESSES, p_ref=16).tolist())
    _same(f"{key} measured counts, 2 ranks", [pinned["measured_2"]],
          [model.seconds(work, 2, halo_bytes=1e6, halo_messages=100, allreduces=10)])
    _same(f"{key} measured counts, 16 ranks", [pinned["measured_16"]],
          [model.seconds(work, 16, halo_bytes=3e6, halo_messages=900, allreduces=40)])


def test_projection_from_the_stampede2_preset_unchanged():
    pinned = PRE_SPLIT["anchor"]
    model = MODELS["projection"]
    _same("projection constants", [pinned[k] for k in pinned],
          [getattr(model, k) for k in pinned])
    cluster = ClusterAssumptions()
    assert (cluster.ranks_per_node, cluster.max_neighbours) == (48, 12)
    _same("network", [12.5e9, 2e-6, 2e-6], [cluster.node_bandwidth_Bps,
                                            cluster.message_latency_s,
                                            cluster.allreduce_latency_s])


def test_communication_terms_are_the_measured_counts_priced():
    model = MODELS["overhead"]
    # 2 ranks: one allreduce level each, so the terms are alpha m + beta h + alpha_ar N
    _same("2 ranks", [5e-6 * 100 + 1e-9 * 1e6 + 3e-6 * 10],
          [model.communication_seconds(2, halo_bytes=1e6, halo_messages=100, allreduces=10)])
    _same("16 ranks", [5e-6 * 900 + 1e-9 * 3e6 + 3e-6 * 40 * 4],
          [model.communication_seconds(16, halo_bytes=3e6, halo_messages=900,
                                       allreduces=40)])
    # a microbenchmark that resolved no bandwidth (beta = 0) prices bytes at nothing
    assert math.isinf(MODELS["no_network"].halo_link.bandwidth_Bps)
    assert MODELS["no_network"].exchange_seconds(1e5, 16) == 0.0


def test_fits_unchanged():
    _same("amdahl C3", PRE_SPLIT["amdahl"], list(amdahl_fit(192, 6854.54, 1536, 1259.08)))
    _same("amdahl E3", PRE_SPLIT["amdahl_e3"], list(amdahl_fit(192, 34319.28, 768, 10071.56)))
    works = [_work(n, st, d, consistent=False)
             for n, st, d in ((4_000, 110, 37), (8_000, 130, 51), (30_000, 131, 69))]
    _same("fit_compute", PRE_SPLIT["fit_compute"],
          list(ScalingModel.fit_compute(works, [1.0, 2.5, 9.0])))
    _same("fit_link", PRE_SPLIT["fit_link"],
          list(ScalingModel.fit_link([8, 1024, 8192, 65536, 262144],
                                     [3.1e-6, 3.3e-6, 4.4e-6, 1.1e-5, 3.0e-5])))


def test_sc18_model_analytic_tables_unchanged():
    """The deterministic tables of ``sc18_model`` for a fixed C3 workload: the cited data,
    the projection against SC'18, the network sensitivity, the efficiency grid and the
    dofs per rank where the projection drops below 0.8."""
    work, cluster = WORKS["c3"], ClusterAssumptions()
    for i, row in enumerate(PRE_SPLIT["data_rows"]):
        _same(f"data row {i}", row, sc18_data_rows()[i])
    assert len(sc18_data_rows()) == len(PRE_SPLIT["data_rows"])
    projection = project_c3(work, cluster)
    assert len(projection.rows) == len(PRE_SPLIT["projection_rows"])
    for i, row in enumerate(PRE_SPLIT["projection_rows"]):
        _same(f"projection row {i}", row, projection.rows[i])
    sensitivity = sensitivity_rows(work, cluster)
    assert len(sensitivity) == len(PRE_SPLIT["sensitivity"])
    for i, row in enumerate(PRE_SPLIT["sensitivity"]):
        _same(f"sensitivity row {i}", row, sensitivity[i])
    grid = [[d, ranks_for(d), projection.model.parallel_efficiency(work, ranks_for(d))]
            for d in DOFS_PER_RANK_GRID]
    for i, row in enumerate(PRE_SPLIT["grid"]):
        _same(f"grid row {i}", row, grid[i])
    _same("crossing", [PRE_SPLIT["crossing"]], [efficiency_crossing(projection.model, work)])
    _same("serial seconds", [PRE_SPLIT["serial_s"]],
          [amdahl_fit(SC18_C3.processes[0], SC18_C3.seconds[0], SC18_C3.processes[-1],
                      SC18_C3.seconds[-1])[0]])
